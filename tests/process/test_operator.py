"""Operator tools: pause, resume, retry, drain, and the fiberflow flow/checkpoints commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import pytest

from flows import FOREVER, FlowKilledException
from flows.cli.local import print_flow_list, request_operation
from flows.node.client import decode_outcome
from flows.node.inspection import dump_checkpoint, list_flows
from flows.node.node import NodeDrainingError
from flows.party import Party
from flows.testing import MockNetwork
from samples.pingpong import PingFlow
from statemachine.state import FlowStatus
from tests.conftest import CORDAPPS
from tests.cordapp import BEHAVIOUR, PatientFlow, ShapeShifterFlow
from tests.helpers import restore_now
from tests.process.test_runtime import client_of, running, two_nodes

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


def mock(tmp_path: Path, backend: str = "sqlite") -> MockNetwork:
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=backend)
    net.create_node(ALICE)
    net.create_node(BOB)
    return net


def test_a_paused_flow_waits_across_a_restart_until_resumed(tmp_path: Path, backend: str) -> None:
    net = mock(tmp_path, backend)
    alice, bob = net.nodes
    handle = alice.start_flow(PingFlow(bob.party))
    alice.run_once()  # suspended, waiting for the pong
    alice.pause_flow(handle.flow_id)
    net.run_network()
    assert alice.flow_status(handle.flow_id) is FlowStatus.SUSPENDED  # the pong waits
    alice.restart()
    net.run_network()
    assert alice.flow_status(handle.flow_id) is not FlowStatus.COMPLETED
    alice.resume_flow(handle.flow_id)
    net.run_network()
    assert handle.result() == "Pong"
    net.stop_nodes()


def test_a_hospitalized_flow_is_retried_after_the_fix(tmp_path: Path, backend: str) -> None:
    net = mock(tmp_path, backend)
    alice = net.nodes[0]
    handle = alice.start_flow(ShapeShifterFlow())
    net.run_network(advance_clock=False)
    BEHAVIOUR["shape"] = "changed"
    alice.restart()
    restore_now(alice)  # restored lazily: restore it now to look at it
    net.run_network(advance_clock=False)
    assert alice.flow_status(handle.flow_id) is FlowStatus.HOSPITALIZED
    alice.retry_flow(handle.flow_id)  # not fixed yet: back to the hospital
    net.run_network(advance_clock=False)
    assert alice.flow_status(handle.flow_id) is FlowStatus.HOSPITALIZED
    BEHAVIOUR.clear()  # "deploy the fix"
    alice.retry_flow(handle.flow_id)
    net.run_network()
    assert handle.result() == "done"
    net.stop_nodes()


def test_a_draining_node_lets_its_flows_finish_and_counts_them(
    tmp_path: Path, backend: str
) -> None:
    net = mock(tmp_path, backend)
    alice, bob = net.nodes
    pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(3)]
    alice.run_once()  # the pings are sent and wait for their pongs
    assert alice.node.set_draining(True) == 3  # three flows left
    net.run_network()
    assert [ping.result() for ping in pings] == ["Pong"] * 3  # they finished while draining
    assert alice.node.set_draining(True) == 0
    with pytest.raises(NodeDrainingError):
        alice.start_flow(PingFlow(bob.party))
    net.stop_nodes()


def test_a_draining_node_refuses_new_flows_and_sessions(tmp_path: Path, backend: str) -> None:
    net = mock(tmp_path, backend)
    alice, bob = net.nodes
    assert bob.node.set_draining(True) == 0
    with pytest.raises(NodeDrainingError):
        bob.start_flow(PingFlow(alice.party))
    handle = alice.start_flow(PingFlow(bob.party))
    net.run_network()
    with pytest.raises(Exception, match="is draining"):
        handle.result()
    bob.restart()  # draining outlives a restart (or a recovery by the flow hospital)
    assert bob.node.draining
    with pytest.raises(NodeDrainingError):
        bob.start_flow(PingFlow(alice.party))
    bob.node.set_draining(False)
    bob.restart()
    assert not bob.node.draining
    assert bob.start_flow(PingFlow(alice.party)) is not None
    net.stop_nodes()


def test_flow_list_shows_what_waits_on_what_and_what_is_hibernated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    alice = attrs.evolve(alice, hibernate_after=0.0)  # every waiting flow hibernates at once
    client = client_of(alice)
    with running([alice, bob]):
        client.start_flows([PatientFlow(Party(bob.name), FOREVER, False) for _ in range(2)])
        for _ in range(400):
            capsys.readouterr()
            print_flow_list(alice)
            table = capsys.readouterr().out
            if "2 hibernated" in table:
                break
            client.wait([], 0.05)
        assert "2 flow(s) with a checkpoint on " in table
        assert ": 2 waiting on a receive" in table
        assert "2 live, 0 in memory, 2 hibernated or not restored since its start" in table


def test_operator_commands_reach_a_running_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    client = client_of(alice)
    try:
        with running([alice, bob]):
            (flow_id,) = client.start_flows([PatientFlow(Party(bob.name), FOREVER, False)])
            for _ in range(200):
                flows = list_flows(alice)
                if flows and flows[0]["status"] == "SUSPENDED":
                    break
                client.wait([], 0.05)
            (listed,) = list_flows(alice)
            assert listed["flow_id"] == flow_id and listed["class"] == "PatientFlow"
            assert listed["waiting_on"] == "receive from Bob " + bob.name.split()[1].split(",")[0]
            assert listed["step"] == "Waiting for an answer"  # the progress tracker's step
            assert re.fullmatch(r"\d+s", listed["age"]), listed["age"]
            capsys.readouterr()
            assert print_flow_list(alice) == 0
            table = capsys.readouterr().out
            assert "PROGRESS STEP" in table and "AGE" in table
            assert f"{flow_id}  PatientFlow  SUSPENDED" in table
            assert "Waiting for an answer" in table and "1 flow(s) with a checkpoint" in table
            dumped = dump_checkpoint(alice, flow_id)
            assert dumped["integrity"] == "MAC ok" and dumped["status"] == "SUSPENDED"
            requests = [step["request"][0] for step in dumped["journal"]]
            assert requests == ["InitiateSession", "SetProgress", "Send"]
            assert dumped["progress_step"] == "Waiting for an answer"
            json.dumps(dumped)
            assert request_operation(alice, "pause", flow_id, 30) == 0
            assert list_flows(alice)[0]["status"] == "PAUSED"
            paused = dump_checkpoint(alice, flow_id)  # says what flow list says
            assert (paused["status"], paused["stored_status"]) == ("PAUSED", "SUSPENDED")
            capsys.readouterr()
            assert print_flow_list(alice, as_json=True) == 0
            listed_json = json.loads(capsys.readouterr().out)
            assert [f["flow_id"] for f in listed_json["flows"]] == [flow_id]
            assert listed_json["flows"][0]["status"] == "PAUSED"
            assert len(listed_json["processes"]) == 1  # the running node's report
            assert request_operation(alice, "resume", flow_id, 30) == 0
            assert request_operation(alice, "kill", flow_id, 30) == 0
            with pytest.raises(FlowKilledException):
                decode_outcome(client.wait([flow_id], 30)[flow_id])
            assert request_operation(alice, "kill", "no-such-flow", 30) == 1
            assert request_operation(alice, "drain", None, 30) == 0
            (refused,) = client.start_flows([PingFlow(Party(bob.name))])
            with pytest.raises(Exception, match="draining"):
                decode_outcome(client.wait([refused], 30)[refused])
    finally:
        client.close()


def test_a_command_for_a_node_that_is_not_running_times_out(tmp_path: Path) -> None:
    alice, _, _ = two_nodes(tmp_path, "sqlite")
    client_of(alice).close()  # the node's database, made as the node makes it
    assert request_operation(alice, "drain", None, 0.2) == 3


def test_flow_retry_answers_with_the_reason_when_the_flow_goes_back_to_the_hospital(
    tmp_path: Path,
) -> None:
    """``flow retry`` replays the flow before answering: a flow whose replay fails again is
    an error (exit 1) naming why, not ``ok``; after the fix the same command answers ok."""
    net = mock(tmp_path)
    alice = net.nodes[0]
    handle = alice.start_flow(ShapeShifterFlow())
    net.run_network(advance_clock=False)
    BEHAVIOUR["shape"] = "changed"
    alice.restart()
    restore_now(alice)
    net.run_network(advance_clock=False)
    assert alice.flow_status(handle.flow_id) is FlowStatus.HOSPITALIZED
    control = alice.node.database.control

    def retry() -> str:
        request_id = control.request_operation("retry", handle.flow_id, 0.0)
        assert alice.node.process_operator_requests() == 1
        outcome = control.operation_outcome(request_id)
        assert outcome is not None
        return outcome

    failed = retry()  # not fixed yet
    assert failed.startswith(f"error: flow {handle.flow_id} went straight back to the hospital: ")
    assert "NonDeterminism" in failed or "determinis" in failed, failed
    assert alice.flow_status(handle.flow_id) is FlowStatus.HOSPITALIZED
    BEHAVIOUR.clear()  # "deploy the fix"
    assert retry() == f"ok: retry {handle.flow_id}"
    net.run_network()
    assert handle.result() == "done"
    net.stop_nodes()


def test_flow_list_shows_failed_flows_with_their_errors_and_all_shows_every_finished_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed flow has no checkpoint left; flow list shows it (class and message) in the
    table and in --json, the most recent ones by default, every one (and the completed
    flows) with --all."""
    from flows.config.runtime import RuntimeConfig
    from flows.node import inspection
    from tests.cordapp import FailingInitiator

    net = mock(tmp_path)
    alice, bob = net.nodes
    failing = [alice.start_flow(FailingInitiator(bob.party, "internal")) for _ in range(2)]
    ping = alice.start_flow(PingFlow(bob.party))
    net.run_network()
    assert ping.result() == "Pong"
    for handle in failing:
        with pytest.raises(Exception):  # noqa: B017 (which one is not the point here)
            handle.result()
    bob_url = str(bob.node.database.engine.url)
    net.stop_nodes()
    config = RuntimeConfig(
        name=BOB, database_url=bob_url, transport_url=f"sqlite:///{tmp_path / 'queue.db'}"
    )
    capsys.readouterr()
    assert print_flow_list(config) == 0
    table = capsys.readouterr().out
    failed_rows = [line for line in table.splitlines() if "FailingResponder  FAILED" in line]
    assert len(failed_rows) == 2, table
    assert table.count(" failed: KeyError: 'secret internal detail 0xdeadbeef'") == 2, table
    assert "2 failed flow(s) (shown above)" in table
    assert "PongFlow" not in table  # completed flows only with --all
    assert print_flow_list(config, as_json=True) == 0
    document = json.loads(capsys.readouterr().out)
    failed = [f for f in document["flows"] if f["status"] == "FAILED"]
    assert [f["class"] for f in failed] == ["FailingResponder"] * 2
    assert {f["error_class"] for f in failed} == {"builtins.KeyError"}
    assert document["failed_not_shown"] == 0
    monkeypatch.setattr(inspection, "FAILED_SHOWN", 1)
    assert print_flow_list(config) == 0
    table = capsys.readouterr().out
    assert "2 failed flow(s) (the 1 most recent shown; --all lists every one)" in table
    assert print_flow_list(config, everything=True) == 0
    table = capsys.readouterr().out
    assert table.count("FailingResponder  FAILED") == 2
    assert re.search(r"PongFlow +COMPLETED", table), table
