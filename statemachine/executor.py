"""The action executor: performs a batch of transitions' actions, exactly-once style.

All ``IN_TRANSACTION`` actions of the batch run inside ONE store transaction (one transition,
or a group of them: group commit). Only after that transaction commits do the ``AFTER_COMMIT``
actions run: acknowledging inbound messages, handing outbox rows to the transport, arming
timers. If anything fails before the commit, the transaction is rolled back and the error
propagates: nothing was acknowledged and nothing was sent, so the transport redelivers and a
restarted node replays from the previous checkpoint.

``on_boundary`` (tests only) is called with the name of every point where a real crash could
fall; raising from it simulates the node dying there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from statemachine.actions import (
    AcknowledgeMessages,
    Action,
    HandOffMessages,
    PersistCheckpoint,
    Phase,
    RecordInboundMessages,
    RemoveCheckpoint,
    ScheduleWakeUp,
    StoreFlowError,
    StoreFlowResult,
    WriteOutbox,
)
from statemachine.ports import CheckpointStore, Outbound, OutboxRow, StoreTransaction
from statemachine.session_messages import OutboundSessionMessage

BoundaryHook = Callable[[str], None]


class ActionExecutor:
    """Runs actions against the store, the outbox relay, acknowledgements and timers."""

    def __init__(
        self,
        store: CheckpointStore,
        encode_message: Callable[[OutboundSessionMessage], OutboxRow],
        outbound: Outbound,
        acknowledge: Callable[[Sequence[str]], None],
        schedule_wake_up: Callable[[str, float], None],
        on_boundary: BoundaryHook | None = None,
    ) -> None:
        self._store = store
        self._encode = encode_message
        self._outbound = outbound
        self._acknowledge = acknowledge
        self._schedule_wake_up = schedule_wake_up
        self._on_boundary = on_boundary
        self.transactions = 0
        """How many transactions this executor committed (for statistics and benchmarks)."""

    def _boundary(self, name: str) -> None:
        if self._on_boundary is not None:
            self._on_boundary(name)

    def execute(self, batches: Iterable[Sequence[Action]]) -> None:
        """Perform several transitions' actions with one commit between the two phases."""
        in_transaction: list[Action] = []
        after_commit: list[Action] = []
        for actions in batches:
            for action in actions:
                if action.phase is Phase.IN_TRANSACTION:
                    in_transaction.append(action)
                else:
                    after_commit.append(action)
        if not in_transaction and not after_commit:
            return
        rows: dict[str, OutboxRow] = {}
        if in_transaction:
            self._boundary("before_transaction")
            transaction = self._store.begin()
            try:
                for action in in_transaction:
                    self._run_in_transaction(transaction, action, rows)
                    self._boundary(f"after_{type(action).__name__}")
                transaction.commit()
            except BaseException:
                transaction.rollback()
                raise
            self.transactions += 1
            self._boundary("after_commit")
        for action in after_commit:
            self._run_after_commit(action, rows)
            self._boundary(f"after_{type(action).__name__}")

    def _run_in_transaction(
        self, transaction: StoreTransaction, action: Action, rows: dict[str, OutboxRow]
    ) -> None:
        if isinstance(action, PersistCheckpoint):
            transaction.put_checkpoint(action.checkpoint, action.at)
        elif isinstance(action, RemoveCheckpoint):
            transaction.remove_checkpoint(action.flow_id)
        elif isinstance(action, RecordInboundMessages):
            transaction.record_inbound(action.records, action.at)
        elif isinstance(action, WriteOutbox):
            encoded = [self._encode(message) for message in action.messages]
            rows.update((row.message_id, row) for row in encoded)
            transaction.write_outbox(encoded, action.at)
        elif isinstance(action, StoreFlowResult):
            transaction.store_result(action.flow_id, action.flow_class, action.result, action.at)
        elif isinstance(action, StoreFlowError):
            transaction.store_error(action.flow_id, action.flow_class, action.error, action.at)
        else:
            raise TypeError(f"{type(action).__name__} is not an in-transaction action")

    def _run_after_commit(self, action: Action, rows: dict[str, OutboxRow]) -> None:
        if isinstance(action, AcknowledgeMessages):
            self._acknowledge(action.message_ids)
        elif isinstance(action, HandOffMessages):
            self._outbound.hand_off(
                [rows.get(m.message_id) or self._encode(m) for m in action.messages]
            )
        elif isinstance(action, ScheduleWakeUp):
            self._schedule_wake_up(action.flow_id, action.deadline)
        else:
            raise TypeError(f"{type(action).__name__} is not an after-commit action")
