"""Checkpoint blobs carry a MAC with a node-local key; a changed blob hospitalizes its flow."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import NoResultFound

from flows.node.handles import FlowHospitalizedError
from flows.node.node import UntrustedCheckpointError
from flows.testing import MockNetwork, MockNode
from persistence import schema
from persistence.store import NodeDatabase
from samples.pingpong import PingFlow
from statemachine.state import FlowStatus
from tests.cordapp import EchoFlow, PaymentFlow, ledger_entries
from tests.helpers import restore_now
from tests.unit.test_flow_effects import with_ledger

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


def row_version(node: MockNode, flow_id: str) -> int:
    table = schema.node_checkpoints
    with node.node.database.engine.connect() as connection:  # type: ignore[union-attr]
        return int(
            connection.execute(
                select(table.c.checkpoint_version).where(table.c.flow_id == flow_id)
            ).scalar_one()
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
    restore_now(alice)  # restored lazily: restore it now to look at it
    assert alice.flow_status(first) is FlowStatus.HOSPITALIZED
    assert alice.flow_status(second) is not FlowStatus.HOSPITALIZED
    net.stop_nodes()


def test_an_undecodable_blob_with_a_valid_mac_is_hospitalized_too(
    tmp_path: Path, backend: str
) -> None:
    net, alice, (victim,) = suspended_pings(tmp_path, 1, backend)
    garbage = b"\x93\x01\x02"
    database = alice.node.database
    assert isinstance(database, NodeDatabase)
    mac = database.checkpoints.checkpoint_mac(victim, row_version(alice, victim), garbage)
    assert mac is not None and len(mac) == 32
    write_blob(alice, victim, garbage, mac)
    alice.restart()
    restore_now(alice)  # restored lazily: restore it now to look at it
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


# --- freshness: an older genuine checkpoint is refused ----------------------------------------


def stored(node: MockNode, flow_id: str) -> tuple[dict[str, object], dict[str, object]]:
    """A flow's whole stored checkpoint: its row and its blob row (a backup of them)."""
    rows, blob_rows = schema.node_checkpoints, schema.node_checkpoint_blobs
    with node.node.database.engine.connect() as connection:  # type: ignore[union-attr]
        row = connection.execute(select(rows).where(rows.c.flow_id == flow_id)).one()
        blob = connection.execute(select(blob_rows).where(blob_rows.c.flow_id == flow_id)).one()
    return dict(row._mapping), dict(blob._mapping)


def put_back(node: MockNode, row: dict[str, object], blob: dict[str, object]) -> None:
    """Restore a flow's row and blob from a backup (as an operator, or an attacker, would)."""
    rows, blob_rows = schema.node_checkpoints, schema.node_checkpoint_blobs
    flow_id = row["flow_id"]
    with node.node.database.engine.begin() as connection:  # type: ignore[union-attr]
        for table, values in ((rows, row), (blob_rows, blob)):
            connection.execute(delete(table).where(table.c.flow_id == flow_id))
            connection.execute(insert(table).values(**values))


def echoing(tmp_path: Path, backend: str) -> tuple[MockNetwork, MockNode, MockNode, str]:
    net = MockNetwork(cordapps=["tests.cordapp"], directory=tmp_path, database=backend)
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    flow_id = alice.start_flow(EchoFlow(bob.party, ["a", "b", "c"])).flow_id
    return net, alice, bob, flow_id


def run_until(net: MockNetwork, condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        net.run_once()
    raise AssertionError("the condition never held")


def version_of(node: MockNode, flow_id: str) -> int:
    try:
        return row_version(node, flow_id)
    except NoResultFound:
        return 0


def test_an_older_blob_put_back_is_refused_and_its_effects_do_not_run_again(
    tmp_path: Path, backend: str
) -> None:
    net = MockNetwork(cordapps=["tests.cordapp"], directory=tmp_path, database=backend)
    alice, bob = with_ledger(net.create_node(ALICE)), with_ledger(net.create_node(BOB))
    victim = alice.start_flow(PaymentFlow(bob.party, 7)).flow_id
    other = alice.start_flow(PaymentFlow(bob.party, 8)).flow_id
    _, unstarted = stored(alice, victim)  # version 1: before the debit
    alice.run_once()  # version 2: the debit is committed, the payment sent
    assert version_of(alice, victim) == 2
    write_blob(alice, victim, unstarted["blob"], unstarted["mac"])  # type: ignore[arg-type]
    alice.restart()
    net.run_network()
    with pytest.raises(FlowHospitalizedError, match=r"stale checkpoint: an older genuine .* 1"):
        alice.flow_handle(victim).result()
    assert alice.flow_handle(other).result() == "receipt 8"
    debits = [e for f, e in ledger_entries(alice.node.database.engine) if f == victim]  # type: ignore[union-attr]
    assert debits == ["debit 7"]  # not replayed: the committed debit did not run again
    net.stop_nodes()


def test_an_older_row_and_blob_put_back_are_refused_by_the_consumed_messages(
    tmp_path: Path, backend: str
) -> None:
    net = MockNetwork(cordapps=["tests.cordapp"], directory=tmp_path, database=backend)
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    victim = alice.start_flow(EchoFlow(bob.party, ["a", "b", "c"])).flow_id
    alice.run_once()
    assert version_of(alice, victim) == 2  # "a" sent, nothing received yet
    backup = stored(alice, victim)
    run_until(net, lambda: version_of(alice, victim) >= 3)  # the echo of "a" was consumed
    put_back(alice, *backup)  # a whole older copy of the flow's checkpoint
    alice.restart()
    restore_now(alice)  # restored lazily: restore it now to look at it
    with pytest.raises(FlowHospitalizedError, match=r"stale checkpoint: message 0 of session"):
        alice.flow_handle(victim).result()
    net.stop_nodes()


def test_a_finished_flow_never_comes_back(tmp_path: Path, backend: str) -> None:
    net, alice, (victim,) = suspended_pings(tmp_path, 1, backend)
    backup = stored(alice, victim)
    net.run_network()
    assert alice.flow_handle(victim).result() == "Pong"
    sent = net.messaging.statistics.sent
    put_back(alice, *backup)
    alice.restart()
    net.run_network()
    assert alice.flow_status(victim) is FlowStatus.HOSPITALIZED
    with pytest.raises(FlowHospitalizedError, match="stale checkpoint: the flow already completed"):
        alice.flow_handle(victim).result()
    assert net.messaging.statistics.sent == sent  # the old copy sent nothing again
    net.stop_nodes()
