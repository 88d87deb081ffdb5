"""Quarantine, not node-wide retry: a failure is pinned on the message or flow that caused it.

Each kind is injected while other flows run, on SQLite and PostgreSQL: a poison message (its
routing raises every time), a poison checkpoint (genuine MAC, but it cannot be restored) and
a result row that already exists (the flow's last commit fails every time). The other flows
complete meanwhile; the poison is retried with a backoff of its own and then quarantined
(dead-lettered with the reason) or kept in the hospital.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from sqlalchemy import insert, select, update

from flows.errors import FlowTimeoutException, UnexpectedFlowEndException
from flows.node.handles import FlowHospitalizedError
from flows.node.hospital import MAX_FLOW_FAILURES, MAX_MESSAGE_FAILURES, Hospital
from flows.testing import MockNetwork, MockNode
from persistence import schema
from persistence.checkpoint_codec import decode_checkpoint, encode_checkpoint
from persistence.store import NodeDatabase
from samples.pingpong import PingFlow
from statemachine.ports import FailureAction
from statemachine.state import FlowStatus
from tests.conftest import CORDAPPS
from tests.cordapp import AskFragileFlow, PaymentFlow
from tests.unit.test_flow_effects import with_ledger

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


@pytest.fixture
def hnet(tmp_path: Path, backend: str) -> Iterator[MockNetwork]:
    network = MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=backend, hospital=True)
    yield network
    network.stop_nodes()


def database_of(node: MockNode) -> NodeDatabase:
    database = node.node.database
    assert isinstance(database, NodeDatabase)
    return database


def dead_letter_reasons(node: MockNode) -> list[str]:
    table = schema.node_dead_letters
    with database_of(node).engine.connect() as connection:
        return list(connection.execute(select(table.c.reason).order_by(table.c.id)).scalars())


def test_a_poison_message_is_retried_then_quarantined_while_others_complete(
    hnet: MockNetwork, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob = with_ledger(hnet.create_node(ALICE)), with_ledger(hnet.create_node(BOB))
    cordapps = bob.node.cordapps
    real = type(cordapps).responder_for
    calls: list[str] = []

    def responder_for(self: Any, initiator_class: str) -> Any:
        if self is cordapps and initiator_class.endswith(".PaymentFlow"):
            calls.append(initiator_class)
            raise RuntimeError("a bug met by this one message")
        return real(self, initiator_class)

    monkeypatch.setattr(type(cordapps), "responder_for", responder_for)
    poisoned = alice.start_flow(PaymentFlow(bob.party, 5))
    pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(3)]
    hnet.run_network(advance_clock=False)  # everything but the poison's retries
    assert [p.result() for p in pings] == ["Pong"] * 3  # done while the poison waits
    assert len(calls) == 1 and dead_letter_reasons(bob) == []
    hospital = bob.hospital
    assert hospital is not None
    while len(calls) < MAX_MESSAGE_FAILURES:  # its own backoff, on the mock clock
        deadline = bob.node.next_deadline()
        assert deadline is not None, "the poison message is not waiting for a retry"
        hnet.clock.advance_to(deadline)
        hnet.run_network(advance_clock=False)
    (reason,) = dead_letter_reasons(bob)
    assert reason.startswith("quarantined: taking it in failed 3 times in a row: ")
    assert "RuntimeError: a bug met by this one message" in reason
    assert bob.node.manager.statistics.messages_quarantined == 1
    assert hospital.pinned == MAX_MESSAGE_FAILURES
    # Acknowledged: the transport holds nothing more for Bob; the payer eventually times out.
    assert hnet.messaging.in_flight(bob.name) == 0 and hnet.messaging.pending(bob.name) == 0
    hnet.run_network()
    with pytest.raises(FlowTimeoutException):
        poisoned.result()
    late = alice.start_flow(PingFlow(bob.party))
    hnet.run_network()
    assert late.result() == "Pong"


def poison_checkpoint(node: MockNode, flow_id: str) -> None:
    """Replace a flow's blob by one with a genuine MAC that the state machine cannot restore."""
    database = database_of(node)
    blobs = schema.node_checkpoint_blobs
    with database.engine.begin() as connection:
        blob = connection.execute(
            select(blobs.c.blob).where(blobs.c.flow_id == flow_id)
        ).scalar_one()
        checkpoint = decode_checkpoint(blob)
        poisoned = encode_checkpoint(attrs.evolve(checkpoint, status=FlowStatus.COMPLETED))
        connection.execute(
            update(blobs)
            .where(blobs.c.flow_id == flow_id)
            .values(
                blob=poisoned,
                mac=database.checkpoints.checkpoint_mac(flow_id, checkpoint.version, poisoned),
            )
        )


def test_a_poison_checkpoint_is_kept_and_the_node_starts_and_serves(hnet: MockNetwork) -> None:
    alice, bob = hnet.create_node(ALICE), hnet.create_node(BOB)
    pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(4)]
    alice.run_once()  # every ping has sent its ping and waits for Bob's pong
    poison_checkpoint(alice, pings[0].flow_id)
    alice.restart()
    hnet.run_network()
    assert [p.result() for p in pings[1:]] == ["Pong"] * 3
    with pytest.raises(FlowHospitalizedError, match="cannot be restored: IllegalTransitionError"):
        pings[0].result()
    rows = {flow_id: status for flow_id, _, status in alice.checkpoints()}
    assert rows == {pings[0].flow_id: "HOSPITALIZED"}


def test_a_result_row_that_exists_keeps_its_flow_while_the_others_commit(
    hnet: MockNetwork,
) -> None:
    alice, bob = hnet.create_node(ALICE), hnet.create_node(BOB)
    pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(5)]
    doomed = pings[2].flow_id
    with database_of(alice).engine.begin() as connection:  # e.g. left by a bad restore
        connection.execute(
            insert(schema.node_flow_results).values(
                flow_id=doomed, flow_class="x", result=b"", completed_at=0
            )
        )
    hnet.run_network()
    finished = [p for p in pings if p.flow_id != doomed]
    assert [p.result() for p in finished] == ["Pong"] * 4
    # Its last commit failed (the result row is there); resumed from its checkpoint, that
    # checkpoint is found older than what the node committed (an outcome is stored): kept.
    with pytest.raises(FlowHospitalizedError, match="stale checkpoint: the flow already completed"):
        alice.node.flow_result(doomed)
    assert alice.checkpoints() == [(doomed, "samples.pingpong.flows.PingFlow", "HOSPITALIZED")]
    hospital = alice.hospital
    assert hospital is not None and hospital.pinned >= 1


def test_each_flow_and_message_has_its_own_backoff() -> None:
    hospital = Hospital(seed=5)
    error = RuntimeError("x")
    first = hospital.flow_failed("f1", error)
    for _ in range(5):  # other flows fail and recover: f1's count does not start again
        hospital.flow_failed("f2", error)
        hospital.flow_recovered("f2")
    second = hospital.flow_failed("f1", error)
    assert first.action is second.action is FailureAction.RETRY
    assert 0.05 <= first.delay <= 0.1 and 0.1 <= second.delay <= 0.2
    third = hospital.flow_failed("f1", error)
    assert third.action is FailureAction.KEEP and third.rule == "repeated_failure"
    assert MAX_FLOW_FAILURES == 3
    messages = [hospital.message_failed("m1", error) for _ in range(MAX_MESSAGE_FAILURES)]
    assert [m.action for m in messages] == [FailureAction.RETRY] * 2 + [FailureAction.QUARANTINE]
    assert messages[1].delay > messages[0].delay / 2


def test_node_wide_errors_are_not_pinned() -> None:
    from sqlalchemy.exc import OperationalError

    from flows.node.effects import FlowEffectError
    from persistence.lease import LeaseLostError

    hospital = Hospital()
    locked = OperationalError("COMMIT", {}, Exception("database is locked"))
    assert hospital.is_node_wide(locked)
    assert hospital.is_node_wide(LeaseLostError("gone"))
    effect = FlowEffectError("side effect raised OperationalError", "f1")
    effect.__cause__ = locked
    assert not hospital.is_node_wide(effect)  # one flow's effect met it: counted on the flow
    assert not hospital.is_node_wide(RuntimeError("bug"))
    for node_wide in (locked, LeaseLostError("gone")):  # not counted on whoever met it
        assert hospital.flow_failed("f1", node_wide).action is FailureAction.RAISE
        assert hospital.message_failed("m1", node_wide).action is FailureAction.RAISE
    assert hospital.pinned == 0


def test_a_responder_whose_first_step_fails_ends_and_its_initiator_is_told(
    hnet: MockNetwork,
) -> None:
    """No checkpoint to resume from: the responder ends with the error, once (no loop)."""
    alice, bob = hnet.create_node(ALICE), hnet.create_node(BOB)
    asking = alice.start_flow(AskFragileFlow(bob.party))
    pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(2)]
    hnet.run_network()
    with pytest.raises(UnexpectedFlowEndException):
        asking.result()
    assert [p.result() for p in pings] == ["Pong"] * 2
    assert bob.hospital is not None and bob.hospital.pinned == 1
    table = schema.node_flow_exceptions
    with database_of(bob).engine.connect() as connection:
        (failed,) = connection.execute(
            select(table.c.flow_class, table.c.exception_class, table.c.message)
        ).all()
    assert failed.flow_class == "tests.cordapp.FragileResponder"
    assert failed.exception_class == "flows.node.effects.FlowEffectError"
    assert "RuntimeError: the effect is broken" in failed.message
