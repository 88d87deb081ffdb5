"""The action executor: performs a batch of transitions' actions, exactly-once style.

All ``IN_TRANSACTION`` actions of the batch run inside ONE store transaction (one transition,
or a group of them: group commit), grouped by kind so that each kind is one batched write.
Only after that transaction commits do the ``AFTER_COMMIT`` actions run: acknowledging
inbound messages, handing outbox rows to the transport, arming timers. If anything fails
before the commit, the transaction is rolled back and the error propagates: nothing was
acknowledged and nothing was sent, so the transport redelivers and a restarted node replays
from the previous checkpoint. A failure after the commit is raised as
:class:`~statemachine.errors.AfterCommitError`: the commit stands, so the caller must not
run the same actions again.

Kinds run in the order of ``IN_TRANSACTION_ORDER``. Reordering across flows is harmless (each
flow's rows are its own), and within one flow a removal never precedes a checkpoint of the
same group (a finished flow has no further transitions).

``on_boundary`` (tests only) is called with the name of every point where a real crash could
fall; raising from it simulates the node dying there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from statemachine.actions import (
    AcknowledgeMessages,
    Action,
    ClaimFlowRequests,
    HandOffMessages,
    PersistCheckpoint,
    Phase,
    RecordInboundMessages,
    RecordStatus,
    RemoveCheckpoint,
    RunFlowEffects,
    ScheduleWakeUp,
    StartOperation,
    StoreFlowError,
    StoreFlowResult,
    WriteOutbox,
)
from statemachine.errors import AfterCommitError
from statemachine.ports import (
    CheckpointStore,
    FlowEffects,
    MessageCodec,
    OperationRunner,
    Outbound,
    OutboxRow,
    StoreTransaction,
)
from statemachine.session_messages import (
    OutboundSessionMessage,
)

BoundaryHook = Callable[[str], None]

IN_TRANSACTION_ORDER: tuple[type, ...] = (
    PersistCheckpoint,
    RemoveCheckpoint,
    RecordInboundMessages,
    WriteOutbox,
    RunFlowEffects,
    StoreFlowResult,
    StoreFlowError,
    RecordStatus,
    ClaimFlowRequests,
)
AFTER_COMMIT_ORDER: tuple[type, ...] = (
    AcknowledgeMessages,
    HandOffMessages,
    ScheduleWakeUp,
    StartOperation,
)


class ActionExecutor:
    """Runs actions against the store, the outbox relay, acknowledgements and timers."""

    def __init__(
        self,
        store: CheckpointStore,
        codec: MessageCodec,
        outbound: Outbound,
        acknowledge: Callable[[Sequence[str], bool], None],
        schedule_wake_up: Callable[[str, float], None],
        on_boundary: BoundaryHook | None = None,
        effects: FlowEffects | None = None,
        operations: OperationRunner | None = None,
    ) -> None:
        self._store = store
        self._operations = operations
        self._effects = effects
        self._codec = codec
        self._outbound = outbound
        self._acknowledge = acknowledge
        self._schedule_wake_up = schedule_wake_up
        self._on_boundary = on_boundary
        self.transactions = 0
        """How many transactions this executor committed (for statistics and benchmarks)."""

    def _row(self, message: OutboundSessionMessage) -> OutboxRow:
        """``message`` encoded as an outbox row."""
        return OutboxRow(message.message_id, message.target, self._codec.encode(message.message))

    def _boundary(self, name: str) -> None:
        if self._on_boundary is not None:
            self._on_boundary(name)

    def execute(self, batches: Iterable[Sequence[Action]]) -> None:
        """Perform several transitions' actions with one commit between the two phases."""
        by_kind: dict[type, list[Any]] = {}
        for actions in batches:
            for action in actions:
                by_kind.setdefault(type(action), []).append(action)
        if not by_kind:
            return
        rows: dict[str, OutboxRow] = {}
        committed = any(kind.phase is Phase.IN_TRANSACTION for kind in by_kind)  # type: ignore[attr-defined]
        if committed:
            self._boundary("before_transaction")
            transaction = self._store.begin()
            try:
                for kind in IN_TRANSACTION_ORDER:
                    if kind in by_kind:
                        self._run_in_transaction(transaction, kind, by_kind[kind], rows)
                        self._boundary(f"after_{kind.__name__}")
                transaction.commit()
            except BaseException:
                transaction.rollback()
                raise
            self.transactions += 1
            self._boundary("after_commit")
        try:
            if RunFlowEffects in by_kind and self._effects is not None:
                self._effects.committed(by_kind[RunFlowEffects])
            for kind in AFTER_COMMIT_ORDER:
                if kind in by_kind:
                    self._run_after_commit(kind, by_kind[kind], rows, committed)
                    self._boundary(f"after_{kind.__name__}")
        except Exception as error:
            raise AfterCommitError(f"after the commit: {type(error).__name__}: {error}") from error

    def _run_in_transaction(
        self,
        transaction: StoreTransaction,
        kind: type,
        actions: list[Any],
        rows: dict[str, OutboxRow],
    ) -> None:
        if kind is PersistCheckpoint:
            transaction.put_checkpoints(actions)
        elif kind is RemoveCheckpoint:
            transaction.remove_checkpoints(actions)
        elif kind is RecordInboundMessages:
            transaction.record_inbound(actions)
        elif kind is WriteOutbox:
            timed: list[tuple[OutboxRow, float]] = []
            for action in actions:
                for message in action.messages:
                    row = self._row(message)
                    rows[row.message_id] = row
                    timed.append((row, action.at))
            transaction.write_outbox(timed)
        elif kind is RunFlowEffects:
            if self._effects is None:
                raise RuntimeError("flows asked for side effects but the node runs none")
            self._effects.run(actions, transaction)
        elif kind is StoreFlowResult:
            transaction.store_results(actions)
        elif kind is StoreFlowError:
            transaction.store_errors(actions)
        elif kind is RecordStatus:
            transaction.record_statuses(actions)
        elif kind is ClaimFlowRequests:
            transaction.claim_flow_requests(actions)
        else:
            raise TypeError(f"{kind.__name__} is not an in-transaction action")

    def _run_after_commit(
        self, kind: type, actions: list[Any], rows: dict[str, OutboxRow], committed: bool
    ) -> None:
        if kind is AcknowledgeMessages:
            ids = [mid for action in actions for mid in action.message_ids]
            self._acknowledge(ids, committed)
        elif kind is HandOffMessages:
            self._outbound.hand_off(
                [
                    rows.get(m.message_id) or self._row(m)
                    for action in actions
                    for m in action.messages
                ]
            )
        elif kind is ScheduleWakeUp:
            for action in actions:
                self._schedule_wake_up(action.flow_id, action.deadline)
        elif kind is StartOperation:
            if self._operations is None:
                raise RuntimeError("a flow called an external operation but the node runs none")
            self._operations.start(actions)
        else:
            raise TypeError(f"{kind.__name__} is not an after-commit action")
