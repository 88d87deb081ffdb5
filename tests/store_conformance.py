"""The conformance suite every node store must pass.

A backend's test file subclasses :class:`StoreConformance` and provides a ``harness`` fixture
(a :class:`StoreHarness`). The suite checks the contracts of a store's parts: the state
machine's ``CheckpointStore`` and ``StoreTransaction`` (``statemachine/ports.py``), the
outbox the relays use, and the control plane (``persistence/node_store.py``):

* a transaction is all or nothing: nothing is visible before the commit, nothing after a
  rollback or a failed write;
* the last checkpoint written for a flow wins; removed checkpoints are gone; checkpoints load
  oldest first;
* a dedup id recorded twice fails the transaction; ``consumed_among`` reports exactly the
  committed ids;
* outcomes and dead letters are kept; outbox rows stay until deleted;
* a client flow request is started once; operator requests are carried out once; paused flows,
  settings and busy notes are remembered;
* the lease fences every write of the node.

The non-durable in-memory store (``store.durable`` is False) has a null control plane and takes
no lease: where the contract says so, the cases assert its documented refusal or its
forgetting instead.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import pytest
from sqlalchemy import update

from persistence import schema
from persistence.lease import LeaseLostError
from persistence.memory_store import NO_OPERATIONS, NO_REQUESTS, InMemoryStore
from persistence.node_store import FlowRequest, OperatorRequest, StoredOutcome
from persistence.schema import millis
from persistence.sql_transaction import FlowRequestClaimError
from persistence.store import NodeDatabase
from persistence.worker_process import WorkerInfo
from statemachine.actions import (
    ClaimFlowRequests,
    PersistCheckpoint,
    RecordInboundMessages,
    RecordStatus,
    RemoveCheckpoint,
    StoreFlowError,
    StoreFlowResult,
)
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.limits import MESSAGE_ID_CHARS
from statemachine.ports import InboundMessage, OutboxRow, StoreTransaction
from statemachine.session_messages import InboundRecord
from statemachine.state import Checkpoint, FlowStatus, StartedLocally

Store = NodeDatabase | InMemoryStore
FLOW_CLASS = "tests.cordapp.ConformanceFlow"
SENDER = "O=Bob,L=New York,C=US"


def loaded(store: Any, flow_id: str) -> Checkpoint | None:
    """The trusted checkpoint the store reports for ``flow_id`` (None: none stored)."""
    stored = store.checkpoints.load_checkpoint(flow_id)
    if stored is None:
        return None
    assert stored.problem is None, stored.problem
    return stored.checkpoint  # type: ignore[no-any-return]


def loaded_all(store: Any) -> list[Checkpoint | None]:
    """The trusted checkpoints the store reports, in its order (oldest first)."""
    return [stored.checkpoint for stored in store.checkpoints.load_checkpoints()]


class StoreHarness(Protocol):
    """What the suite needs from a backend."""

    duplicate_id_error: type[Exception]
    """What recording a dedup id a second time raises."""

    def open(self) -> Store:
        """A store on the backend's database (closed by the harness).

        On a durable backend every call opens the same database again, as another process
        would; the in-memory store is a new, empty store each time.
        """

    def dead_letters(self, store: Store) -> list[tuple[str, str, str, bytes]]:
        """(message id, sender, reason, payload) of the store's dead letters, oldest first."""


def checkpoint(
    flow_id: str,
    *,
    created_at: float = 1_000.0,
    version: int = 1,
    status: FlowStatus = FlowStatus.RUNNABLE,
    step: str | None = None,
) -> Checkpoint:
    """A checkpoint of a flow started locally (no sessions: nothing makes it stale)."""
    return Checkpoint(
        flow_id=flow_id,
        origin=StartedLocally(FLOW_CLASS, b"arguments of " + flow_id.encode()),
        status=status,
        created_at=created_at,
        progress_step=step,
        version=version,
    )


def record(message_id: str, sequence: int = 0) -> RecordInboundMessages:
    """The dedup record of one consumed message."""
    return RecordInboundMessages(
        (InboundRecord(message_id, SENDER, f"session-{message_id}", sequence),), 2_000.0
    )


def error(message: str) -> FlowError:
    """A flow's error as the store keeps it."""
    return FlowError(ErrorKind.FLOW_EXCEPTION, "tests.cordapp.ConformanceError", message)


def write_group(transaction: StoreTransaction, tag: str) -> None:
    """Everything a group of transitions writes, named after ``tag``."""
    transaction.put_checkpoints([PersistCheckpoint(checkpoint(f"flow-{tag}"), 2_000.0)])
    transaction.record_inbound([record(f"message-{tag}")])
    transaction.write_outbox([(OutboxRow(f"out-{tag}", SENDER, tag.encode()), 2_000.0)])
    transaction.store_results([StoreFlowResult(f"done-{tag}", FLOW_CLASS, b"result", 2_000.0)])
    transaction.store_errors([StoreFlowError(f"failed-{tag}", FLOW_CLASS, error(tag), 2_000.0)])


def visible(store: Store, tag: str) -> dict[str, bool]:
    """Which of :func:`write_group`'s writes a reader sees."""
    parts = store.checkpoints
    return {
        "checkpoint": parts.load_checkpoint(f"flow-{tag}") is not None,
        "dedup id": parts.consumed_among([f"message-{tag}"]) == {f"message-{tag}"},
        "outbox row": f"out-{tag}" in [row.message_id for row in store.outbox.pending_outbox()],
        "result": parts.stored_outcome(f"done-{tag}") is not None,
        "error": parts.stored_outcome(f"failed-{tag}") is not None,
    }


def commit(store: Store, *writes: object) -> None:
    """Commit one transaction with the given actions (each goes to its method)."""
    transaction = store.checkpoints.begin()
    try:
        for action in writes:
            if isinstance(action, PersistCheckpoint):
                transaction.put_checkpoints([action])
            elif isinstance(action, RemoveCheckpoint):
                transaction.remove_checkpoints([action])
            elif isinstance(action, RecordInboundMessages):
                transaction.record_inbound([action])
            elif isinstance(action, StoreFlowResult):
                transaction.store_results([action])
            elif isinstance(action, StoreFlowError):
                transaction.store_errors([action])
            elif isinstance(action, ClaimFlowRequests):
                transaction.claim_flow_requests([action])
            elif isinstance(action, RecordStatus):
                transaction.record_statuses([action])
            else:
                raise TypeError(f"not a store action: {action!r}")
    except BaseException:
        transaction.rollback()
        raise
    transaction.commit()


class StoreConformance:
    """The cases; a backend's test class provides the ``harness`` fixture."""

    # --- transactions -----------------------------------------------------------------

    def test_nothing_is_visible_before_the_commit_and_nothing_after_a_rollback(
        self, harness: StoreHarness
    ) -> None:
        store = harness.open()
        nothing = dict.fromkeys(["checkpoint", "dedup id", "outbox row", "result", "error"], False)
        transaction = store.checkpoints.begin()
        write_group(transaction, "a")
        assert visible(store, "a") == nothing
        transaction.rollback()
        assert visible(store, "a") == nothing
        transaction = store.checkpoints.begin()
        write_group(transaction, "a")
        transaction.commit()
        assert visible(store, "a") == dict.fromkeys(nothing, True)

    def test_a_dedup_id_recorded_twice_fails_the_transaction_and_it_keeps_nothing(
        self, harness: StoreHarness
    ) -> None:
        store = harness.open()
        commit(store, record("m-1"))
        transaction = store.checkpoints.begin()
        write_group(transaction, "b")
        with pytest.raises(harness.duplicate_id_error):
            transaction.record_inbound([record("m-1", sequence=7)])
        transaction.rollback()
        assert not any(visible(store, "b").values())
        transaction = store.checkpoints.begin()
        with pytest.raises(harness.duplicate_id_error):  # twice in one transaction
            transaction.record_inbound([record("m-2"), record("m-2")])
        transaction.rollback()
        assert store.checkpoints.consumed_among(["m-1", "m-2"]) == {"m-1"}
        assert store.count("node_message_ids") == 1

    def test_consumed_among_reports_exactly_the_committed_ids(self, harness: StoreHarness) -> None:
        store = harness.open()
        recorded = [f"id-{n:04}" for n in range(1_200)]  # more than one query's worth
        commit(store, RecordInboundMessages(tuple(record(i).records[0] for i in recorded), 1.0))
        asked = [f"id-{n:04}" for n in range(1_300, 0, -1)]  # three queries' worth
        assert store.checkpoints.consumed_among(asked) == set(recorded) - {"id-0000"}
        assert store.checkpoints.consumed_among([]) == set()
        assert store.checkpoints.is_consumed("id-0999")
        assert not store.checkpoints.is_consumed("id-1200")

    # --- checkpoints ------------------------------------------------------------------

    def test_the_last_checkpoint_written_for_a_flow_wins(self, harness: StoreHarness) -> None:
        store = harness.open()
        first, second = checkpoint("f", version=1, step="one"), checkpoint("f", version=2)
        second = attrs.evolve(second, progress_step="two", status=FlowStatus.SUSPENDED)
        other = checkpoint("g", created_at=2_000.0)
        commit(store, PersistCheckpoint(first, 1.0), PersistCheckpoint(other, 1.0))
        transaction = store.checkpoints.begin()
        transaction.put_checkpoints([PersistCheckpoint(first, 2.0), PersistCheckpoint(second, 2.0)])
        transaction.commit()
        assert loaded(store, "f") == second
        assert loaded_all(store) == [second, other]
        third = attrs.evolve(second, version=3, progress_step="three")
        commit(store, PersistCheckpoint(third, 3.0))
        assert loaded(store, "f") == third
        assert [(s.flow_id, s.status) for s in store.checkpoints.checkpoint_summaries()] == [
            ("f", "SUSPENDED"),
            ("g", "RUNNABLE"),
        ]
        assert store.count("node_checkpoints") == 2

    def test_removed_checkpoints_are_gone(self, harness: StoreHarness) -> None:
        store = harness.open()
        commit(store, *(PersistCheckpoint(checkpoint(f), 1.0) for f in ("a", "b", "c")))
        commit(store, RemoveCheckpoint("a"), RemoveCheckpoint("c"), RemoveCheckpoint("never"))
        assert store.checkpoints.load_checkpoint("a") is None
        assert [c.flow_id for c in loaded_all(store)] == ["b"]
        assert store.count("node_checkpoints") == 1
        commit(store, PersistCheckpoint(checkpoint("a", version=2), 2.0))  # back again
        assert loaded(store, "a") == checkpoint("a", version=2)

    def test_checkpoints_load_oldest_first(self, harness: StoreHarness) -> None:
        store = harness.open()
        created = {"a": 300.0, "b": 100.0, "c": 200.0}  # neither write nor id order
        writes = [PersistCheckpoint(checkpoint(f, created_at=t), 1.0) for f, t in created.items()]
        commit(store, *writes)
        assert [c.flow_id for c in loaded_all(store)] == ["b", "c", "a"]
        assert [s.flow_id for s in store.checkpoints.checkpoint_summaries()] == ["b", "c", "a"]
        assert loaded(store, "c") == checkpoint("c", created_at=200.0)
        assert store.checkpoints.load_checkpoint("unknown") is None

    def test_a_recorded_status_shows_in_the_row_and_the_blob_is_untouched(
        self, harness: StoreHarness
    ) -> None:
        store = harness.open()
        kept = checkpoint("sick", status=FlowStatus.SUSPENDED)
        commit(store, PersistCheckpoint(kept, 1.0), PersistCheckpoint(checkpoint("well"), 1.0))
        reason = "kept for observation"
        commit(
            store,
            RecordStatus("sick", FlowStatus.HOSPITALIZED, reason),
            RecordStatus("unknown", FlowStatus.HOSPITALIZED, "nothing to mark"),
        )
        stored = store.checkpoints.load_checkpoint("sick")
        summaries = {s.flow_id: s.status for s in store.checkpoints.checkpoint_summaries()}
        assert stored is not None and stored.checkpoint == kept  # the blob is untouched
        if not store.durable:  # documented: no rows, the live flow's status is what shows
            assert stored.row_status is FlowStatus.SUSPENDED and stored.row_reason is None
            assert summaries == {"sick": "SUSPENDED", "well": "RUNNABLE"}
            return
        assert (stored.row_status, stored.row_reason) == (FlowStatus.HOSPITALIZED, reason)
        assert stored.problem is None
        assert summaries == {"sick": "HOSPITALIZED", "well": "RUNNABLE"}
        assert loaded(store, "well") == checkpoint("well")
        commit(store, RecordStatus("sick", FlowStatus.SUSPENDED, None))  # retried
        stored = store.checkpoints.load_checkpoint("sick")
        assert stored is not None and (stored.row_status, stored.row_reason) == (
            FlowStatus.SUSPENDED,
            None,
        )

    # --- outcomes, dead letters, outbox -----------------------------------------------

    def test_outcomes_are_kept(self, harness: StoreHarness) -> None:
        store = harness.open()
        commit(
            store,
            PersistCheckpoint(checkpoint("running"), 1.0),
            RemoveCheckpoint("won"),
            StoreFlowResult("won", FLOW_CLASS, b"\x01result", 1.0),
            StoreFlowError("lost", FLOW_CLASS, error("it broke"), 1.0),
        )
        won = StoredOutcome("won", FLOW_CLASS, b"\x01result", None)
        lost = StoredOutcome("lost", FLOW_CLASS, None, error("it broke"))
        assert store.checkpoints.stored_outcome("won") == won
        assert store.checkpoints.stored_outcome("lost") == lost
        assert store.checkpoints.stored_outcome("running") is None
        assert store.checkpoints.stored_outcomes(["won", "lost", "running", "unknown"]) == {
            "won": won,
            "lost": lost,
        }
        known = store.checkpoints.known_flows(["won", "lost", "running", "unknown"])
        assert known == {"won", "lost", "running"}
        assert (store.count("node_flow_results"), store.count("node_flow_exceptions")) == (1, 1)

    def test_dead_letters_are_kept_with_the_reason(self, harness: StoreHarness) -> None:
        store = harness.open()
        store.checkpoints.dead_letter(InboundMessage("m-1", SENDER, b"\x00one"), "bad", 1.0)
        long_id = "x" * (MESSAGE_ID_CHARS + 50)
        store.checkpoints.dead_letter(InboundMessage(long_id, SENDER, b"two"), "worse", 2.0)
        (first, second) = harness.dead_letters(store)
        assert first == ("m-1", SENDER, "bad", b"\x00one")
        assert second[1:] == (SENDER, "worse", b"two")
        assert len(second[0]) <= MESSAGE_ID_CHARS and second[0] != long_id[:MESSAGE_ID_CHARS]
        assert store.count("node_dead_letters") == 2

    def test_outbox_rows_stay_until_deleted(self, harness: StoreHarness) -> None:
        store = harness.open()
        rows = [OutboxRow(f"out-{n}", SENDER, bytes([n])) for n in range(4)]
        for at, row in enumerate(rows):
            transaction = store.checkpoints.begin()
            transaction.write_outbox([(row, 10.0 + at)])
            transaction.commit()
        assert store.outbox.pending_outbox() == rows  # oldest first
        store.outbox.delete_outbox(["out-1", "out-3", "never"])
        store.outbox.delete_outbox([])
        assert store.outbox.pending_outbox() == [rows[0], rows[2]]
        assert store.count("node_outbox") == 2

    # --- control plane ----------------------------------------------------------------

    def test_a_flow_request_is_started_once(self, harness: StoreHarness) -> None:
        store = harness.open()
        control = store.control
        requests = [FlowRequest(f"request-{n}", FLOW_CLASS, bytes([n])) for n in range(3)]
        if not store.durable:  # documented refusal: no client can reach this store
            with pytest.raises(ValueError, match=NO_REQUESTS):
                control.request_flows(requests, 1.0)
            assert control.pending_flow_requests(10) == []
            with pytest.raises(ValueError, match=NO_REQUESTS):
                commit(store, ClaimFlowRequests(("request-0",), 2.0))
            commit(store, ClaimFlowRequests((), 2.0))  # claiming nothing is no request
            return
        control.request_flows(requests, 1.0)
        control.request_flows([FlowRequest("request-0", "other.Flow", b"")], 2.0)  # kept as was
        assert control.pending_flow_requests(10) == requests
        assert control.pending_flow_requests(2) == requests[:2]
        commit(store, ClaimFlowRequests(("request-0", "request-2"), 3.0))
        assert control.pending_flow_requests(10) == [requests[1]]
        with pytest.raises(FlowRequestClaimError):
            commit(store, ClaimFlowRequests(("request-1", "request-2"), 4.0))
        assert control.pending_flow_requests(10) == [requests[1]]  # the claim was rolled back
        with pytest.raises(FlowRequestClaimError):
            commit(store, ClaimFlowRequests(("never-requested",), 4.0))

    def test_pending_flow_requests_say_which_ids_are_flows_already(
        self, harness: StoreHarness
    ) -> None:
        store = harness.open()
        if not store.durable:  # no client can reach this store: nothing is ever pending
            assert store.control.flow_requests_to_start(10) == []
            return
        commit(
            store,
            PersistCheckpoint(checkpoint("running"), 1.0),
            StoreFlowResult("won", FLOW_CLASS, b"\x01result", 1.0),
            StoreFlowError("lost", FLOW_CLASS, error("it broke"), 1.0),
        )
        ids = ["running", "won", "lost", "new"]
        requests = [FlowRequest(request_id, FLOW_CLASS, b"") for request_id in ids]
        store.control.request_flows(requests, 2.0)
        found = store.control.flow_requests_to_start(10)
        assert [p.request for p in found] == store.control.pending_flow_requests(10)
        assert {p.request.request_id: p.already_a_flow for p in found} == {
            "running": True,
            "won": True,
            "lost": True,
            "new": False,
        }
        assert len(store.control.flow_requests_to_start(2)) == 2

    def test_an_operator_request_is_carried_out_once(self, harness: StoreHarness) -> None:
        store = harness.open()
        control = store.control
        if not store.durable:  # documented refusal: no operator can reach this store
            with pytest.raises(ValueError, match=NO_OPERATIONS):
                control.request_operation("pause", "f", 1.0)
            assert control.pending_operations() == []
            assert control.operation_outcome("any") is None
            return
        pause = control.request_operation("pause", "f", 1.0)
        drain = control.request_operation("drain", None, 2.0)
        assert pause != drain
        assert control.pending_operations() == [
            OperatorRequest(pause, "pause", "f"),
            OperatorRequest(drain, "drain", None),
        ]
        assert control.operation_outcome(pause) is None
        control.finish_operation(pause, "ok: pause f", 3.0)
        assert control.operation_outcome(pause) == "ok: pause f"
        assert control.pending_operations() == [OperatorRequest(drain, "drain", None)]

    def test_paused_flows_and_settings_are_remembered(self, harness: StoreHarness) -> None:
        store = harness.open()
        control = store.control
        control.set_paused("p", True, 1.0)
        control.set_paused("q", True, 1.0)
        control.set_paused("q", False, 2.0)
        control.set_setting("draining", "true", 1.0)
        control.set_setting("colour", "blue", 1.0)
        control.set_setting("colour", None, 2.0)
        again = harness.open()
        if not store.durable:  # the null control plane remembers nothing
            for plane in (control, again.control):
                assert plane.paused_flows() == set()
                assert (plane.setting("draining"), plane.setting("colour")) == (None, None)
            return
        for plane in (control, again.control):  # (as a restarted node sees them)
            assert plane.paused_flows() == {"p"}
            assert (plane.setting("draining"), plane.setting("colour")) == ("true", None)

    def test_busy_flows_are_noted_until_cleared(self, harness: StoreHarness) -> None:
        store = harness.open()
        control = store.control
        control.note_busy_flow("slow", 10.0, "flows.py:1")
        control.note_busy_flow("slow", 10.0, "flows.py:2")  # a later note replaces it
        control.note_busy_flow("stuck", 20.5, "x" * 3_000)
        control.clear_busy_flow("stuck")
        control.clear_busy_flow("never")
        if not store.durable:  # the null control plane notes nothing
            assert control.busy_flows() == {}
            return
        assert control.busy_flows() == {"slow": (millis(10.0), "flows.py:2")}
        control.note_busy_flow("stuck", 20.5, "x" * 3_000)
        assert control.busy_flows()["stuck"] == (millis(20.5), "x" * 2_000)  # location cut

    # --- the lease --------------------------------------------------------------------

    def test_the_lease_fences_every_write_of_the_node(self, harness: StoreHarness) -> None:
        store = harness.open()
        if not store.durable:  # documented: never shared, so no lease and nothing fenced
            assert store.new_lease(None, 20) is None
            store.checkpoints.check_lease()
            return
        store.checkpoints.check_lease()  # no lease yet: nothing to check
        lease = store.new_lease(None, 20)
        assert lease is not None
        lease.acquire()
        store.lease = lease
        store.checkpoints.check_lease()
        commit(store, PersistCheckpoint(checkpoint("f"), 1.0))
        successor = harness.open()  # another process, after this one stopped renewing
        with successor.engine.begin() as connection:
            connection.execute(update(schema.node_workers).values(expires_at=0))
        taker = successor.new_lease(WorkerInfo.of_this_process(), 20)
        assert taker is not None
        taker.acquire()
        message = InboundMessage("m", SENDER, b"")
        fenced_writes = {
            "check_lease": store.checkpoints.check_lease,
            "begin": store.checkpoints.begin,
            "dead_letter": lambda: store.checkpoints.dead_letter(message, "x", 1.0),
            "finish_operation": lambda: store.control.finish_operation("r", "ok", 1.0),
            "set_paused": lambda: store.control.set_paused("f", True, 1.0),
            "set_setting": lambda: store.control.set_setting("draining", "true", 1.0),
        }
        for name, write in fenced_writes.items():
            try:
                write()
            except LeaseLostError:
                continue
            pytest.fail(f"{name} went through after the node lost its lease")
        summary = store.checkpoints.checkpoint_summaries()
        assert [(s.flow_id, s.status) for s in summary] == [("f", "RUNNABLE")]
        assert store.count("node_dead_letters") == 0
        assert store.control.paused_flows() == set()
        assert store.control.setting("draining") is None
