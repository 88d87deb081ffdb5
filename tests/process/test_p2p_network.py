"""The peer-to-peer topology with real node processes: each node its own inbound, bridges.

Alice and Bob each own a RabbitMQ vhost (standing in for a broker of their own); Carol's
inbound is a SQL queue on PostgreSQL. No two nodes share a transport: each node consumes its
own inbound and reaches the others only through the bridges to the addresses they published
in the network map. Peers log into Alice's and Bob's brokers with a peer account that may
only publish to the ``p2p.inbound`` exchange (``peer_account_commands``). The network has a
trust root: each node's certificate was issued by it from the node's request, and a node
believes a node-info (a peer's key and address) only if it chains to that root and carries
the node's own signature.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from cryptography.hazmat.primitives.serialization import Encoding
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from flows.network.doorman import ROOT_CERTIFICATE_FILE, RootAuthority, certificate_request
from flows.network.identity import NodeIdentity, load_or_create_identity
from flows.network.map import NetworkMap, NodeInfo, node_key
from flows.party import Party
from tests.conftest import (
    PIKA_MISSING,
    POSTGRES_URL,
    postgres_problem,
    rabbitmq_problem,
    require_service,
)

pytest.importorskip("pika", reason=PIKA_MISSING)  # before the imports that need it

import pika
import pika.exceptions

from messaging.amqp import peer_account_commands, queue_depth, queue_name
from messaging.sqlqueue.peer_roles import apply_statements, peer_role_statements
from persistence import schema
from samples.pingpong import PingFlow
from samples.trade import BuyerFlow, TradeOutcome
from tests.process_cluster import NAMES, RUN, ClusterNode
from tests.waiting import wait_until

ALICE, BOB, CAROL = NAMES
PEER_USER = f"ff-peer-{RUN}"
PEER_PASSWORD = f"peer-secret-{RUN}"
pytestmark = pytest.mark.slow


def rabbitmqctl(command: str) -> None:
    """Run one ``rabbitmqctl`` command line (it must succeed)."""
    subprocess.run(shlex.split(command), check=True, capture_output=True, timeout=120)


def amqp_url(vhost: str, user: str = "guest", password: str = "guest") -> str:
    """The URL of ``vhost`` on the test broker."""
    return f"amqp://{user}:{password}@127.0.0.1:5672/{quote(vhost, safe='')}"


@contextlib.contextmanager
def _autocommit() -> Iterator[Connection]:
    """A connection to the test PostgreSQL server outside transactions (CREATE DATABASE)."""
    engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


class P2PNetwork:
    """Alice and Bob on vhosts of their own, Carol on a PostgreSQL queue; bridges between."""

    def __init__(self, directory: Path) -> None:
        self.vhosts = {ALICE: f"ff-p2p-alice-{RUN}", BOB: f"ff-p2p-bob-{RUN}"}
        for vhost in self.vhosts.values():
            rabbitmqctl(f"rabbitmqctl add_vhost {vhost}")
            rabbitmqctl(f"rabbitmqctl set_permissions -p {vhost} guest '.*' '.*' '.*'")
        rabbitmqctl(f"rabbitmqctl add_user {PEER_USER} {PEER_PASSWORD}")
        for vhost in self.vhosts.values():
            for command in peer_account_commands(vhost, PEER_USER, PEER_PASSWORD)[1:]:
                rabbitmqctl(command)
        # Carol's inbound: a PostgreSQL database of her own; Alice and Bob each get a role
        # there that may insert into her queue only.
        self.carol_database = f"ff_p2p_carol_{RUN}"
        self.carol_roles = {ALICE: f"ff_p2p_alice_{RUN}", BOB: f"ff_p2p_bob_{RUN}"}
        with _autocommit() as connection:
            connection.execute(text(f'CREATE DATABASE "{self.carol_database}"'))
        carol_inbound = make_url(POSTGRES_URL).set(database=self.carol_database)
        self.inbound = {
            ALICE: amqp_url(self.vhosts[ALICE]),
            BOB: amqp_url(self.vhosts[BOB]),
            CAROL: carol_inbound.render_as_string(hide_password=False),
        }
        for role in self.carol_roles.values():
            apply_statements(self.inbound[CAROL], peer_role_statements(role, "pw-" + RUN, CAROL))

        def credentials(name: str) -> str:
            text = f'[bridge_credentials."*"]\nuser = "{PEER_USER}"\npassword = "{PEER_PASSWORD}"\n'
            if name in self.carol_roles:
                role = self.carol_roles[name]
                text += f'[bridge_credentials."{CAROL}"]\nuser = "{role}"\npassword = "pw-{RUN}"\n'
            return text

        self.root = RootAuthority.create(directory / "root", "CN=Test Network Root,O=Fiberflow")
        self.nodes = {}
        for name in NAMES:
            identity = load_or_create_identity(directory / f"{node_key(name)}.key.pem", name)
            certificate = self.root.issue(certificate_request(identity))
            certificate_file = directory / f"{node_key(name)}.cert.pem"
            certificate_file.write_bytes(certificate.public_bytes(Encoding.PEM))
            fields = {
                "topology": "p2p",
                "network_map": "network-map",
                "network_root": f"root/{ROOT_CERTIFICATE_FILE}",
                "certificate": certificate_file.name,
            }
            self.nodes[name] = ClusterNode(
                name, directory, None, self.inbound[name], fields, credentials(name)
            )
        self.map = NetworkMap(directory / "network-map", self.root.network_root())
        self.directory = directory

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()
        for node in self.nodes.values():
            node.wait_started()

    def close(self) -> None:
        for node in self.nodes.values():
            node.stop()
            node.client.close()
        with _autocommit() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": self.carol_database},
            )
            connection.execute(text(f'DROP DATABASE IF EXISTS "{self.carol_database}"'))
            for role in self.carol_roles.values():
                connection.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        for vhost in self.vhosts.values():
            subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True, timeout=120)
        subprocess.run(["rabbitmqctl", "delete_user", PEER_USER], capture_output=True, timeout=120)

    def status(self, name: str) -> dict[str, Any]:
        """The node's status file."""
        result: dict[str, Any] = json.loads(self.nodes[name].status_path.read_text())
        return result

    def bridges(self, name: str) -> dict[str, dict[str, Any]]:
        """The node's bridges as its status file lists them, by peer."""
        return {bridge["peer"]: bridge for bridge in self.status(name).get("bridges") or []}

    def outbox_rows(self, name: str) -> int:
        """Rows left in the node's outbox."""
        with self.nodes[name].client.database.engine.connect() as connection:
            return len(connection.execute(schema.node_outbox.select()).all())


@pytest.fixture
def network(tmp_path: Path) -> Iterator[P2PNetwork]:
    require_service("RabbitMQ", rabbitmq_problem())
    require_service("PostgreSQL", postgres_problem())
    require_service(
        "rabbitmqctl", None if shutil.which("rabbitmqctl") else "rabbitmqctl is not on PATH"
    )
    network = P2PNetwork(tmp_path)
    try:
        network.start()
        yield network
    finally:
        network.close()


def test_three_nodes_each_on_its_own_inbound_run_ping_pong_and_the_trade(
    network: P2PNetwork,
) -> None:
    published = {name: info.transport for name, info in network.map.nodes().items()}
    assert published == {
        ALICE: f"amqp://127.0.0.1:5672/{quote(network.vhosts[ALICE], safe='')}",
        BOB: f"amqp://127.0.0.1:5672/{quote(network.vhosts[BOB], safe='')}",
        CAROL: f"postgresql://127.0.0.1:5432/{network.carol_database}",
    }
    alice, carol = network.nodes[ALICE], network.nodes[CAROL]
    bob_party, carol_party, alice_party = Party(BOB), Party(CAROL), Party(ALICE)
    pings = alice.client.start_flows([PingFlow(bob_party), PingFlow(carol_party)])
    pings += carol.client.start_flows([PingFlow(alice_party), PingFlow(bob_party)])
    trades = alice.client.start_flows(
        [BuyerFlow(bob_party, carol_party, "widget", 3, 1000 + n) for n in range(3)]
    )
    for flow_id in pings[:2] + trades:
        alice.client.wait([flow_id], 120)
    carol.client.wait(pings[2:], 120)
    assert [alice.client.result(f) for f in pings[:2]] == ["Pong", "Pong"]
    assert [carol.client.result(f) for f in pings[2:]] == ["Pong", "Pong"]
    outcomes = [alice.client.result(f) for f in trades]
    assert all(isinstance(outcome, TradeOutcome) for outcome in outcomes)
    assert len({outcome.trade_id for outcome in outcomes}) == 3
    # Exactly once on every node: each responder ran once per session.
    bob_ran = network.nodes[BOB].counts(schema.node_flow_results)
    assert (bob_ran["PongFlow"], bob_ran["SellerFlow"]) == (2, 3)
    carol_ran = network.nodes[CAROL].counts(schema.node_flow_results)
    assert (carol_ran["PongFlow"], carol_ran["ApproverFlow"], carol_ran["PingFlow"]) == (1, 3, 2)
    alice_ran = network.nodes[ALICE].counts(schema.node_flow_results)
    assert (alice_ran["PongFlow"], alice_ran["PingFlow"], alice_ran["BuyerFlow"]) == (1, 2, 3)
    for name in NAMES:
        wait_until(
            functools.partial(lambda n: network.outbox_rows(n) == 0, name),
            f"{name}'s outbox to empty",
            30,
        )
    # Bob's inbound is on his broker only: Alice's has no queue of his.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
        passive_declare(amqp_url(network.vhosts[ALICE]), queue_name(BOB))

    def alice_bridges() -> dict[str, object]:
        return {peer: b["address"] for peer, b in network.bridges(ALICE).items()}

    expected = {BOB: published[BOB], CAROL: published[CAROL]}
    wait_until(lambda: alice_bridges() == expected, "Alice's status to list her bridges", 30)


def passive_declare(url: str, queue: str) -> None:
    """Ask the broker at ``url`` whether ``queue`` exists (raises if it does not)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        connection.channel().queue_declare(queue, passive=True)
    finally:
        if connection.is_open:
            connection.close()


def test_a_peer_account_may_publish_to_the_inbound_exchange_only(network: P2PNetwork) -> None:
    peer = amqp_url(network.vhosts[BOB], PEER_USER, PEER_PASSWORD)
    connection = pika.BlockingConnection(pika.URLParameters(peer))
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="ACCESS_REFUSED"):
            connection.channel().basic_get(queue_name(BOB))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="ACCESS_REFUSED"):
            connection.channel().queue_declare(f"peer-made-{uuid.uuid4().hex}")
        for exchange in ("", "p2p.deadletter", "amq.topic"):  # the default exchange first
            channel = connection.channel()
            channel.confirm_delivery()  # a refused publish then fails here, not later
            with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="ACCESS_REFUSED"):
                channel.basic_publish(exchange, queue_name(BOB), b"not through p2p.inbound")
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            "p2p.inbound", queue_name(BOB), b"through p2p.inbound", mandatory=True
        )
    finally:
        if connection.is_open:
            connection.close()


def test_a_peer_cut_off_for_a_while_loses_nothing_and_holds_back_no_other(
    network: P2PNetwork,
) -> None:
    alice = network.nodes[ALICE]
    bob_party, carol_party = Party(BOB), Party(CAROL)
    rabbitmqctl(f"rabbitmqctl clear_permissions -p {network.vhosts[BOB]} {PEER_USER}")
    to_bob = alice.client.start_flows([PingFlow(bob_party) for _ in range(3)])
    to_carol = alice.client.start_flows([PingFlow(carol_party) for _ in range(3)])
    alice.client.wait(to_carol, 120)  # Carol is served while Bob is cut off

    def bob_refused() -> bool:
        return str(network.bridges(ALICE).get(BOB, {}).get("state")).startswith("unreachable")

    wait_until(bob_refused, "Alice's bridge to Bob to be refused", 60)
    assert alice.client.outcomes(to_bob) == {}
    assert network.outbox_rows(ALICE) >= 3  # kept, not lost
    for command in peer_account_commands(network.vhosts[BOB], PEER_USER, PEER_PASSWORD)[1:]:
        rabbitmqctl(command)
    alice.client.wait(to_bob, 120)
    assert [alice.client.result(f) for f in to_bob] == ["Pong"] * 3
    assert network.nodes[BOB].counts(schema.node_flow_results)["PongFlow"] == 3
    assert network.nodes[CAROL].counts(schema.node_flow_results)["PongFlow"] == 3


def test_the_bridge_follows_a_peer_whose_address_changed(network: P2PNetwork) -> None:
    alice, bob = network.nodes[ALICE], network.nodes[BOB]
    first = alice.client.start_flow(PingFlow(Party(BOB)))
    alice.client.wait([first], 120)
    # Bob moves to a broker account of his own on a new vhost: a new inbound address.
    new_vhost = f"ff-p2p-bob2-{RUN}"
    network.vhosts["bob2"] = new_vhost
    rabbitmqctl(f"rabbitmqctl add_vhost {new_vhost}")
    rabbitmqctl(f"rabbitmqctl set_permissions -p {new_vhost} guest '.*' '.*' '.*'")
    for command in peer_account_commands(new_vhost, PEER_USER, PEER_PASSWORD)[1:]:
        rabbitmqctl(command)
    bob.stop()
    old_inbound = network.inbound[BOB]
    config = bob.config_path.read_text().replace(
        json.dumps(old_inbound), json.dumps(amqp_url(new_vhost))
    )
    # Peers may send to the old inbound until they see the move: Bob drains it meanwhile.
    bob.config_path.write_text(f"former_inbounds = [{json.dumps(old_inbound)}]\n" + config)
    bob.start()
    bob.wait_started()
    wait_until(
        lambda: new_vhost in network.map.nodes()[BOB].transport.replace("%2F", "/"),
        "Bob's node-info to name his new inbound",
        30,
    )
    # Alice may not have seen the move yet (she reads the map at most every second): what
    # she sends meanwhile goes to Bob's old inbound, which he drains.
    second = alice.client.start_flow(PingFlow(Party(BOB)))
    alice.client.wait([second], 120)
    assert alice.client.result(second) == "Pong"

    def bridge_moved() -> bool:
        return new_vhost in str(network.bridges(ALICE)[BOB]["address"])

    wait_until(bridge_moved, "Alice's bridge to Bob to follow him", 30)
    third = alice.client.start_flow(PingFlow(Party(BOB)))
    alice.client.wait([third], 120)
    assert alice.client.result(third) == "Pong"
    assert network.nodes[BOB].counts(schema.node_flow_results)["PongFlow"] == 3
    assert queue_depth(amqp_url(new_vhost), BOB) == 0
    assert queue_depth(old_inbound, BOB) == 0  # drained: nothing stranded there


def test_node_infos_from_another_root_or_tampered_are_refused_and_nothing_goes_there(
    network: P2PNetwork,
) -> None:
    alice = network.nodes[ALICE]
    # Dave is certified by another root; his node-info names a queue of his own.
    elsewhere = RootAuthority.create(network.directory / "other-root", "CN=Another Root")
    dave_name = f"O=Dave {RUN},L=Oslo,C=NO"
    dave = NodeIdentity.generate(dave_name)
    dave_queue = f"sqlite:///{network.directory / 'dave-queue.db'}"
    dave_certificate = elsewhere.issue(certificate_request(dave)).public_bytes(Encoding.PEM)
    network.map.publish(
        NodeInfo(
            dave_name,
            dave_name,
            dave_queue,
            dave.public_key_hex,
            certificate=dave_certificate.decode(),
        ),
        identity=dave,
    )
    # Carol's node-info altered after she signed it: her address now names Dave's queue.
    carol_file = network.map.directory / f"{node_key(CAROL)}.json"
    genuine = carol_file.read_text()
    document = json.loads(genuine)
    document["transport"] = dave_queue
    carol_file.write_text(json.dumps(document))
    reasons = {path.stem: reason for path, reason in network.map.rejected()}
    assert (
        "another root" in reasons[node_key(dave_name)]
        or "issued by" in reasons[node_key(dave_name)]
    )
    assert "signature" in reasons[node_key(CAROL)]

    # A flow that asks for a party whose node-info is refused fails at once, saying why;
    # nothing is queued for it (issue 18: it used to be retried for ever).
    to_dave = alice.client.start_flow(PingFlow(Party(dave_name)))
    to_carol = alice.client.start_flow(PingFlow(Party(CAROL)))
    outcomes = alice.client.wait([to_dave, to_carol], 120)
    for flow_id, peer, why in ((to_dave, dave_name, "root"), (to_carol, CAROL, "signature")):
        error = outcomes[flow_id].error
        assert error is not None and error.exception_class == "flows.errors.UnknownPartyError"
        assert f"cannot reach {peer}: its node-info on the network map is refused" in (
            error.message
        )
        assert why in error.message or "issued by" in error.message
    log = alice.log_path.read_text()
    for flow_id in (to_dave, to_carol):  # each failure logged, with its traceback
        assert f"flow {flow_id} (samples.pingpong.flows.PingFlow) failed: " in log
    assert not (network.directory / "dave-queue.db").exists()  # nothing ever went there
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "node",
            "outbox",
            "--config",
            str(alice.config_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert listed == ["the outbox is empty: every message was confirmed by its peer's transport"]
    # The genuine node-info back, replaced whole as a node publishes it: Carol can be asked
    # again at once (the map's directory changed, so Alice reads it again).
    restored = carol_file.with_suffix(".restored.tmp")
    restored.write_text(genuine)
    restored.replace(carol_file)
    again = alice.client.start_flow(PingFlow(Party(CAROL)))
    alice.client.wait([again], 120)
    assert alice.client.result(again) == "Pong"
