"""``fiberflow outbox list|drop``: messages for a party that left, seen and dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli.main import main
from flows.network.identity import NodeIdentity
from flows.network.map import NetworkMap, NodeInfo
from flows.testing import MockNetwork
from tests.cordapp import BEHAVIOUR, AskStrangerFlow

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"
CAROL = "O=Carol,L=Zurich,C=CH"


def _alice_config(tmp_path: Path, net: MockNetwork, network_map: Path) -> Path:
    alice = net.nodes[0]
    config = tmp_path / "alice.toml"
    config.write_text(
        f'name = "{ALICE}"\n'
        f'database_url = "{alice.config.database_url}"\n'
        f'transport_url = "sqlite:///{tmp_path / "queue.db"}"\n'
        f'network_map = "{network_map}"\n'
    )
    return config


@pytest.fixture
def left(tmp_path: Path) -> tuple[MockNetwork, str]:
    """Alice has a live flow whose message waits for Bob, who left the network map."""
    net = MockNetwork(cordapps=["tests.cordapp"], directory=tmp_path / "net")
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    BEHAVIOUR["after_initiate"] = lambda: net.peer_keys.remove(BOB)
    handle = alice.start_flow(AskStrangerFlow(bob.party))
    net.run_network(advance_clock=False)
    yield net, handle.flow_id
    net.stop_nodes()


def test_list_shows_the_row_its_flow_and_what_the_map_says(
    tmp_path: Path, left: tuple[MockNetwork, str], capsys: pytest.CaptureFixture[str]
) -> None:
    net, flow_id = left
    (tmp_path / "map").mkdir()
    config = _alice_config(tmp_path, net, tmp_path / "map")
    assert main(["outbox", "list", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"1 message(s) in the outbox of {ALICE}, for 1 peer(s):" in out
    assert f"{BOB}: 1 message(s)" in out and "1 from live flows" in out
    assert "not in the network map (left, or never joined)" in out
    assert f"{flow_id}  live" in out
    assert main(["outbox", "list", "--config", str(config), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["messages"]
    assert row["peer"] == BOB and row["flow_id"] == flow_id and row["flow_live"] is True
    assert row["on_network_map"] is False


def test_drop_deletes_the_rows_of_a_party_off_the_map_and_names_the_live_flows(
    tmp_path: Path, left: tuple[MockNetwork, str], capsys: pytest.CaptureFixture[str]
) -> None:
    net, flow_id = left
    (tmp_path / "map").mkdir()
    config = _alice_config(tmp_path, net, tmp_path / "map")
    assert main(["outbox", "drop", "--config", str(config), "--peer", BOB]) == 0
    out = capsys.readouterr().out
    assert f"dropped 1 message(s) for {BOB}" in out
    assert f"1 live flow(s) sent them and may wait for an answer that cannot come: {flow_id}" in out
    alice = net.nodes[0]
    assert alice.node.database.outbox.pending_outbox() == []
    net.run_network(advance_clock=False)  # the node's relay forgets it too
    assert alice.node.relay.waiting() == 0
    assert main(["outbox", "drop", "--config", str(config), "--peer", BOB]) == 0
    assert "nothing dropped" in capsys.readouterr().out


def test_drop_refuses_a_party_on_the_map_and_a_missing_map(
    tmp_path: Path, left: tuple[MockNetwork, str], capsys: pytest.CaptureFixture[str]
) -> None:
    net, _ = left
    config = _alice_config(tmp_path, net, tmp_path / "no-map-here")
    assert main(["outbox", "drop", "--config", str(config), "--peer", BOB]) == 2
    assert "cannot tell whether" in capsys.readouterr().err
    network_map = NetworkMap(tmp_path / "map")
    bob = NodeIdentity.generate(BOB)
    network_map.publish(
        NodeInfo(BOB, BOB, "sqlite:///bob.db", bob.public_key_hex, bob.agreement_key.hex()),
        identity=bob,
    )
    config = _alice_config(tmp_path, net, tmp_path / "map")
    assert main(["outbox", "drop", "--config", str(config), "--peer", BOB]) == 2
    err = capsys.readouterr().err
    assert f"{BOB} is in the network map at sqlite:///bob.db" in err and "nothing" not in err
    assert len(net.nodes[0].node.database.outbox.pending_outbox()) == 1
