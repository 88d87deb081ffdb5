"""Checkpoint blobs carry a MAC with a node-local key; a changed blob hospitalizes its flow."""

from __future__ import annotations

import hmac
from pathlib import Path

import pytest
from sqlalchemy import select, update

from flows.node import FlowHospitalizedError, UntrustedCheckpointError
from flows.testing import MockNetwork, MockNode
from persistence import schema
from samples.pingpong import PingFlow
from statemachine.state import FlowStatus

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


def suspended_pings(
    tmp_path: Path, count: int, backend: str = "sqlite"
) -> tuple[MockNetwork, MockNode, list[str]]:
    """Alice's pings, checkpointed while they wait for Bob's pongs (Bob never runs)."""
    net = MockNetwork(cordapps=["samples.pingpong"], directory=tmp_path, database=backend)
    alice = net.create_node(ALICE)
    bob = net.create_node(BOB)
    ids = [alice.start_flow(PingFlow(bob.party)).flow_id for _ in range(count)]
    alice.run_once()
    assert {status for _, _, status in alice.checkpoints()} == {"SUSPENDED"}
    return net, alice, ids


def blobs(node: MockNode) -> dict[str, tuple[bytes, bytes]]:
    table = schema.node_checkpoint_blobs
    with node.node.database.engine.connect() as connection:  # type: ignore[union-attr]
        rows = connection.execute(select(table.c.flow_id, table.c.blob, table.c.mac)).all()
    return {row.flow_id: (row.blob, row.mac) for row in rows}


def write_blob(node: MockNode, flow_id: str, blob: bytes, mac: bytes) -> None:
    table = schema.node_checkpoint_blobs
    with node.node.database.engine.begin() as connection:  # type: ignore[union-attr]
        connection.execute(
            update(table).where(table.c.flow_id == flow_id).values(blob=blob, mac=mac)
        )


def test_every_blob_has_a_mac_and_an_untouched_one_restores(tmp_path: Path, backend: str) -> None:
    net, alice, ids = suspended_pings(tmp_path, 1, backend)
    ((_, mac),) = blobs(alice).values()
    assert len(mac) == 32
    alice.restart()
    net.run_network()
    assert alice.flow_handle(ids[0]).result() == "Pong"
    net.stop_nodes()


def test_a_changed_blob_sends_its_flow_to_the_hospital_and_is_kept(
    tmp_path: Path, backend: str
) -> None:
    net, alice, (victim, other) = suspended_pings(tmp_path, 2, backend)
    blob, mac = blobs(alice)[victim]
    tampered = blob.replace(b"Ping", b"Pong")
    assert tampered != blob
    write_blob(alice, victim, tampered, mac)
    alice.restart()
    net.run_network()
    assert alice.flow_status(victim) is FlowStatus.HOSPITALIZED
    with pytest.raises(FlowHospitalizedError, match="checkpoint MAC does not match"):
        alice.flow_handle(victim).result()
    assert alice.flow_handle(other).result() == "Pong"  # the others are unaffected
    assert blobs(alice)[victim] == (tampered, mac)  # kept as found, for the operator
    assert (victim, "samples.pingpong.flows.PingFlow", "HOSPITALIZED") in alice.checkpoints()
    net.stop_nodes()


def test_blobs_swapped_between_flows_are_caught(tmp_path: Path, backend: str) -> None:
    net, alice, (first, second) = suspended_pings(tmp_path, 2, backend)
    stored = blobs(alice)
    write_blob(alice, first, *stored[second])
    alice.restart()
    assert alice.flow_status(first) is FlowStatus.HOSPITALIZED
    assert alice.flow_status(second) is not FlowStatus.HOSPITALIZED
    net.stop_nodes()


def test_an_undecodable_blob_with_a_valid_mac_is_hospitalized_too(
    tmp_path: Path, backend: str
) -> None:
    net, alice, (victim,) = suspended_pings(tmp_path, 1, backend)
    garbage = b"\x93\x01\x02"
    key = alice.identity.mac_key()
    mac = hmac.new(key, victim.encode() + b"\0" + garbage, "sha256").digest()
    write_blob(alice, victim, garbage, mac)
    alice.restart()
    with pytest.raises(FlowHospitalizedError, match="undecodable checkpoint"):
        alice.flow_handle(victim).result()
    net.stop_nodes()


def test_an_untrusted_flow_is_not_retried_until_its_blob_is_restored(
    tmp_path: Path, backend: str
) -> None:
    net, alice, (victim,) = suspended_pings(tmp_path, 1, backend)
    good = blobs(alice)[victim]
    blob, mac = good
    write_blob(alice, victim, blob.replace(b"Ping", b"Pong"), mac)
    alice.restart()
    with pytest.raises(UntrustedCheckpointError, match="restore its checkpoint"):
        alice.retry_flow(victim)
    net.run_network(advance_clock=False)  # Bob answers; the answer waits for the flow
    assert alice.flow_status(victim) is FlowStatus.HOSPITALIZED
    assert blobs(alice)[victim][1] == mac  # the evidence is still there
    write_blob(alice, victim, *good)  # the operator restores it from a backup
    alice.retry_flow(victim)
    net.run_network()
    assert alice.flow_handle(victim).result() == "Pong"
    net.stop_nodes()


def test_messages_held_for_an_untrusted_flow_are_settled_when_it_is_killed(
    tmp_path: Path, backend: str
) -> None:
    net, alice, (victim,) = suspended_pings(tmp_path, 1, backend)
    blob, mac = blobs(alice)[victim]
    write_blob(alice, victim, blob.replace(b"Ping", b"Pong"), mac)
    alice.restart()
    net.run_network(advance_clock=False)
    address = alice.node.messaging.my_address
    assert net.messaging.in_flight(address) >= 1  # Bob's answer, held for the operator
    alice.kill_flow(victim)
    net.run_network()
    assert net.messaging.in_flight(address) == 0
    assert alice.checkpoints() == []
    net.stop_nodes()
