"""A NON-DURABLE store in plain dicts: "checkpoints off", for benchmarks and experiments.

It keeps the same contract as :class:`persistence.store.NodeDatabase` (transactions are
all-or-nothing, a dedup id cannot be recorded twice) but nothing survives the process, so a
node on it forgets every flow when it restarts. Select it with the database URL ``memory://``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from persistence.bounded import bounded_reason, bounded_text
from persistence.store import CheckpointSummary, StoredOutcome
from statemachine.actions import (
    ClaimFlowRequests,
    PersistCheckpoint,
    RecordInboundMessages,
    RecordStatus,
    RemoveCheckpoint,
    StoreFlowError,
    StoreFlowResult,
)
from statemachine.limits import MESSAGE_ID_CHARS, PARTY_NAME_CHARS
from statemachine.ports import InboundMessage, OutboxRow
from statemachine.state import Checkpoint

MEMORY_URL = "memory://"


@attrs.define
class _Tables:
    checkpoints: dict[str, tuple[Checkpoint, float]] = attrs.field(factory=dict)
    message_ids: set[str] = attrs.field(factory=set)
    outbox: dict[str, OutboxRow] = attrs.field(factory=dict)
    outcomes: dict[str, StoredOutcome] = attrs.field(factory=dict)
    dead_letters: list[tuple[InboundMessage, str]] = attrs.field(factory=list)


class _MemoryTransaction:
    """Buffers writes and applies them to the tables on commit."""

    def __init__(self, store: InMemoryStore) -> None:
        self._store = store
        self._writes: list[Callable[[_Tables], object]] = []
        self._new_ids: set[str] = set()

    def put_checkpoints(self, actions: Sequence[PersistCheckpoint]) -> None:
        """Insert or replace checkpoints."""
        for action in actions:
            self._store.note_checkpoint(action.checkpoint, 0)
        entries = [(a.checkpoint, a.at) for a in actions]
        self._writes.append(
            lambda t: t.checkpoints.update((c.flow_id, (c, at)) for c, at in entries)
        )

    def remove_checkpoints(self, actions: Sequence[RemoveCheckpoint]) -> None:
        """Delete checkpoints."""
        flow_ids = [a.flow_id for a in actions]
        self._writes.append(lambda t: [t.checkpoints.pop(f, None) for f in flow_ids])

    def record_inbound(self, actions: Sequence[RecordInboundMessages]) -> None:
        """Record dedup ids; refuses one recorded before (like the primary key would)."""
        ids = [r.message_id for a in actions for r in a.records]
        for message_id in ids:
            if message_id in self._store.tables.message_ids or message_id in self._new_ids:
                raise ValueError(f"message id {message_id} recorded twice")
            self._new_ids.add(message_id)
        self._writes.append(lambda t: t.message_ids.update(ids))

    def write_outbox(self, rows: Sequence[tuple[OutboxRow, float]]) -> None:
        """Insert outbox rows."""
        self._writes.append(lambda t: t.outbox.update((r.message_id, r) for r, _ in rows))

    def store_results(self, actions: Sequence[StoreFlowResult]) -> None:
        """Keep results."""
        outcomes = [StoredOutcome(a.flow_id, a.flow_class, a.result, None) for a in actions]
        self._writes.append(lambda t: t.outcomes.update((o.flow_id, o) for o in outcomes))

    def store_errors(self, actions: Sequence[StoreFlowError]) -> None:
        """Keep errors."""
        outcomes = [StoredOutcome(a.flow_id, a.flow_class, None, a.error) for a in actions]
        self._writes.append(lambda t: t.outcomes.update((o.flow_id, o) for o in outcomes))

    def record_statuses(self, actions: Sequence[RecordStatus]) -> None:
        """Nothing to record: this store keeps no rows apart from the checkpoints."""

    def claim_flow_requests(self, actions: Sequence[ClaimFlowRequests]) -> None:
        """Refuse: client requests come through a node database, never this store."""
        if any(action.request_ids for action in actions):
            raise ValueError("the in-memory store takes no client flow requests")

    @property
    def handle(self) -> None:
        """No database: flow side effects cannot run here."""
        return None

    def commit(self) -> None:
        """Apply every buffered write."""
        for write in self._writes:
            write(self._store.tables)
        self._writes = []

    def rollback(self) -> None:
        """Forget every buffered write."""
        self._writes = []


class InMemoryStore:
    """Non-durable node store (see the module docstring)."""

    def __init__(self) -> None:
        self.url = MEMORY_URL
        self.tables = _Tables()
        self.checkpoints_written = 0
        self.checkpoint_listeners: list[Callable[[Checkpoint, int], None]] = []

    def note_checkpoint(self, checkpoint: Checkpoint, size: int) -> None:
        """Count a checkpoint write and tell the listeners."""
        self.checkpoints_written += 1
        for listener in self.checkpoint_listeners:
            listener(checkpoint, size)

    def begin(self) -> _MemoryTransaction:
        """Open a transaction."""
        return _MemoryTransaction(self)

    def is_consumed(self, message_id: str) -> bool:
        """True if the id was recorded."""
        return message_id in self.tables.message_ids

    def consumed_among(self, message_ids: Sequence[str]) -> set[str]:
        """The recorded ids among ``message_ids``."""
        return set(message_ids) & self.tables.message_ids

    def load_checkpoints(self) -> list[Checkpoint]:
        """Checkpoints, oldest first."""
        return [
            c for c, _ in sorted(self.tables.checkpoints.values(), key=lambda x: x[0].created_at)
        ]

    def load_checkpoint(self, flow_id: str) -> Checkpoint | None:
        """One flow's checkpoint, or None."""
        entry = self.tables.checkpoints.get(flow_id)
        return None if entry is None else entry[0]

    def mark_hospitalized(self, flow_id: str, reason: str) -> None:
        """Nothing to mark: the in-memory flow's status is what callers see."""

    def check_lease(self) -> None:
        """No lease: a non-durable store is never shared."""

    def checkpoint_summaries(self) -> list[CheckpointSummary]:
        """(flow id, class, status) per checkpoint."""
        return [
            CheckpointSummary(c.flow_id, c.flow_class, c.status.value)
            for c in self.load_checkpoints()
        ]

    def stored_outcome(self, flow_id: str) -> StoredOutcome | None:
        """A finished flow's result or error."""
        return self.tables.outcomes.get(flow_id)

    def dead_letter(self, message: InboundMessage, reason: str, at: float) -> None:
        """Keep an unprocessable message, as the SQL store does.

        Bounded copies of its id, sender and the reason; the payload whole.
        """
        kept = attrs.evolve(
            message,
            message_id=bounded_text(message.message_id, MESSAGE_ID_CHARS),
            sender=bounded_text(message.sender, PARTY_NAME_CHARS),
            delivery=None,
        )
        self.tables.dead_letters.append((kept, bounded_reason(reason)))

    def pending_outbox(self) -> list[OutboxRow]:
        """Outbox rows."""
        return list(self.tables.outbox.values())

    def delete_outbox(self, message_ids: Sequence[str]) -> None:
        """Delete outbox rows."""
        for message_id in message_ids:
            self.tables.outbox.pop(message_id, None)

    def count(self, table_name: str) -> int:
        """Rows in a table, by the SQL table's name."""
        sizes = {
            "node_checkpoints": len(self.tables.checkpoints),
            "node_message_ids": len(self.tables.message_ids),
            "node_outbox": len(self.tables.outbox),
            "node_flow_results": sum(o.error is None for o in self.tables.outcomes.values()),
            "node_flow_exceptions": sum(o.error is not None for o in self.tables.outcomes.values()),
            "node_dead_letters": len(self.tables.dead_letters),
        }
        return sizes[table_name]

    def close(self) -> None:
        """Nothing to release."""
