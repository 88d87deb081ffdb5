"""A NON-DURABLE store in plain dicts: "checkpoints off", for benchmarks and experiments.

It has the parts of :class:`persistence.store.NodeDatabase` and keeps their contracts
(transactions are all-or-nothing, a dedup id cannot be recorded twice), but nothing survives
the process, so a node on it forgets every flow when it restarts. Its control plane is null
(:class:`NullControlPlane`): it takes no client or operator requests and remembers nothing;
nor does it take a lease (it is never shared). Select it with the database URL ``memory://``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import attrs

from foundation.bounded import bounded_reason, bounded_text
from persistence.node_store import (
    CheckpointSummary,
    ControlPlane,
    FlowRequest,
    OperatorRequest,
    PendingFlowRequest,
    StoredOutcome,
)
from statemachine.actions import (
    ClaimFlowRequests,
    PersistCheckpoint,
    RecordInboundMessages,
    RecordStatus,
    RemoveCheckpoint,
    StoreFlowError,
    StoreFlowResult,
)
from statemachine.iorequests import Receive, Sleep
from statemachine.limits import MESSAGE_ID_CHARS, PARTY_NAME_CHARS
from statemachine.ports import InboundMessage, OutboxRow
from statemachine.state import Checkpoint, FlowStatus, IndexEntry, StoredFlow

if TYPE_CHECKING:
    from persistence.lease import NodeLease
    from persistence.worker_process import WorkerInfo

MEMORY_URL = "memory://"
"""The database URL that selects the in-memory store."""

NO_REQUESTS = "the in-memory store takes no client flow requests"
"""Why the in-memory store refuses flow requests (and claims of them)."""

NO_OPERATIONS = "the in-memory store takes no operator requests"
"""Why the in-memory store refuses operator requests."""


@attrs.define
class _Tables:
    checkpoints: dict[str, tuple[Checkpoint, float]] = attrs.field(factory=dict)
    message_ids: set[str] = attrs.field(factory=set)
    outbox: dict[str, OutboxRow] = attrs.field(factory=dict)
    outcomes: dict[str, StoredOutcome] = attrs.field(factory=dict)
    dead_letters: list[tuple[InboundMessage, str]] = attrs.field(factory=list)


class _MemoryTransaction:
    """Buffers writes and applies them to the tables on commit."""

    def __init__(self, store: MemoryCheckpointStore) -> None:
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
        outcomes = [
            StoredOutcome(a.flow_id, a.flow_class, None, a.error, a.traceback) for a in actions
        ]
        self._writes.append(lambda t: t.outcomes.update((o.flow_id, o) for o in outcomes))

    def record_statuses(self, actions: Sequence[RecordStatus]) -> None:
        """Nothing to record: this store keeps no rows apart from the checkpoints."""

    def claim_flow_requests(self, actions: Sequence[ClaimFlowRequests]) -> None:
        """Refuse: client requests come through a node database, never this store."""
        if any(action.request_ids for action in actions):
            raise ValueError(NO_REQUESTS)

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


class MemoryCheckpointStore:
    """The ``CheckpointStore`` port (and the node's reads of outcomes) in dicts."""

    def __init__(self, tables: _Tables) -> None:
        self.tables = tables
        self.checkpoints_written = 0
        """Checkpoints written (inserted or replaced) through this object."""
        self.checkpoint_listeners: list[Callable[[Checkpoint, int], None]] = []
        """Called with each checkpoint written and its blob size (0 here: nothing is encoded)."""

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

    def load_checkpoints(self, flow_ids: Sequence[str] | None = None) -> list[StoredFlow]:
        """Checkpoints as written (always trusted here), oldest first (of ``flow_ids``)."""
        entries = self.tables.checkpoints
        if flow_ids is None:
            found = list(entries.values())
        else:
            found = [entries[flow_id] for flow_id in flow_ids if flow_id in entries]
        ordered = sorted(found, key=lambda x: x[0].created_at)
        return [StoredFlow.trusted(c) for c, _ in ordered]

    def checkpoint_index(self) -> list[IndexEntry]:
        """An entry per checkpoint, oldest first (see the SQL store's)."""
        entries = []
        for stored in self.load_checkpoints():
            checkpoint = stored.checkpoint
            assert checkpoint is not None
            pending = checkpoint.pending
            waiting = (
                checkpoint.status is FlowStatus.SUSPENDED
                and pending is not None
                and isinstance(pending.request, Receive | Sleep)
            )
            wake_at = None if pending is None else pending.deadline
            entries.append(IndexEntry(checkpoint.flow_id, waiting, wake_at))
        return entries

    def load_checkpoint(self, flow_id: str) -> StoredFlow | None:
        """One flow's checkpoint as written, or None."""
        entry = self.tables.checkpoints.get(flow_id)
        return None if entry is None else StoredFlow.trusted(entry[0])

    def check_lease(self) -> None:
        """No lease: a non-durable store is never shared."""

    def has_checkpoint(self, flow_id: str) -> bool:
        """True if ``flow_id`` has a stored checkpoint."""
        return flow_id in self.tables.checkpoints

    def checkpoint_summaries(
        self, flow_ids: Sequence[str] | None = None
    ) -> list[CheckpointSummary]:
        """(flow id, class, status) per checkpoint (of ``flow_ids``)."""
        return [
            CheckpointSummary(s.flow_id, s.flow_class, s.row_status.value)
            for s in self.load_checkpoints(flow_ids)
        ]

    def known_flows(self, flow_ids: Sequence[str]) -> set[str]:
        """Those of ``flow_ids`` that have a checkpoint or a stored outcome."""
        tables = self.tables
        return {f for f in flow_ids if f in tables.checkpoints or f in tables.outcomes}

    def stored_outcome(self, flow_id: str) -> StoredOutcome | None:
        """A finished flow's result or error."""
        return self.tables.outcomes.get(flow_id)

    def completed_flow_ids(self, flow_class: str | None = None) -> list[str]:
        """Ids of the flows that finished with a result, in the order they finished.

        With ``flow_class`` (a qualified class name), only the flows of that class.
        """
        return [
            flow_id
            for flow_id, outcome in self.tables.outcomes.items()
            if outcome.error is None and flow_class in (None, outcome.flow_class)
        ]

    def stored_outcomes(self, flow_ids: Sequence[str]) -> dict[str, StoredOutcome]:
        """The kept outcomes of those of ``flow_ids`` that have finished."""
        outcomes = self.tables.outcomes
        return {f: outcomes[f] for f in flow_ids if f in outcomes}

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


class MemoryOutbox:
    """The outbox in a dict, as the outbox relays use it."""

    def __init__(self, tables: _Tables) -> None:
        self.tables = tables

    def pending_outbox(self) -> list[OutboxRow]:
        """Outbox rows, in the order they were written."""
        return list(self.tables.outbox.values())

    def contains(self, message_id: str) -> bool:
        """True if the row ``message_id`` is still in the outbox."""
        return message_id in self.tables.outbox

    def depth(self) -> tuple[int, float | None]:
        """How many rows the outbox holds (this store keeps no time: the oldest is None)."""
        return len(self.tables.outbox), None

    def delete_outbox(self, message_ids: Sequence[str]) -> None:
        """Delete outbox rows."""
        for message_id in message_ids:
            self.tables.outbox.pop(message_id, None)

    def delete_later(self, message_ids: Sequence[str]) -> None:
        """Delete outbox rows (at once: this store has no transaction to wait for)."""
        self.delete_outbox(message_ids)

    def delete_waiting(self, older_than: float = 0.0) -> int:
        """Nothing waits here (:meth:`delete_later` deletes at once)."""
        return 0


class NullControlPlane(ControlPlane):
    """The control plane of a store nobody else can reach: no requests, no memory.

    Nothing is pending, nothing is paused or set, no flow is noted as busy; remembering a
    pause, a setting or a busy flow does nothing (the node keeps them in memory, for as long
    as it runs). Requests, which would never be carried out, are refused with ``ValueError``.
    """

    def request_flows(self, requests: Sequence[FlowRequest], at: float) -> None:
        """Refuse (with ``ValueError``) any request: no client can reach this store."""
        if requests:
            raise ValueError(NO_REQUESTS)

    def pending_flow_requests(self, limit: int) -> list[FlowRequest]:
        """None."""
        return []

    def flow_requests_to_start(
        self, limit: int, partitions: Collection[int] | None = None
    ) -> list[PendingFlowRequest]:
        """None."""
        return []

    def request_operation(self, action: str, flow_id: str | None, at: float) -> str:
        """Refuse (with ``ValueError``): no operator can reach this store."""
        raise ValueError(NO_OPERATIONS)

    def pending_operations(self) -> list[OperatorRequest]:
        """None."""
        return []

    def finish_operation(self, request_id: str, outcome: str, at: float) -> None:
        """Refuse (with ``ValueError``): there is no operator request to finish."""
        raise ValueError(NO_OPERATIONS)

    def operation_outcome(self, request_id: str) -> str | None:
        """None: no operator request was ever taken."""
        return None

    def set_paused(self, flow_id: str, paused: bool, at: float) -> None:
        """Nothing to remember: a restart forgets every flow anyway."""

    def paused_flows(self) -> set[str]:
        """None."""
        return set()

    def set_setting(self, name: str, value: str | None, at: float) -> None:
        """Nothing to remember: a restart forgets every setting."""

    def setting(self, name: str) -> str | None:
        """None: nothing is set."""
        return None

    def note_busy_flow(self, flow_id: str, since: float, location: str) -> None:
        """Nothing to note: no operator can read it."""

    def clear_busy_flow(self, flow_id: str) -> None:
        """Nothing to clear."""

    def busy_flows(self) -> dict[str, tuple[int, str]]:
        """None."""
        return {}


class InMemoryStore:
    """Non-durable node store (see the module docstring)."""

    durable = False
    """Nothing survives the process."""

    def __init__(self) -> None:
        self.url = MEMORY_URL
        self.tables = _Tables()
        self.checkpoints = MemoryCheckpointStore(self.tables)
        """The state machine's ``CheckpointStore``."""
        self.outbox = MemoryOutbox(self.tables)
        """The outbox relays' ``OutboxStore``."""
        self.control = NullControlPlane()
        """The operator control plane: null."""
        self.schedules = None
        """Schedules need a database: a node on this store has none."""
        self.lease: NodeLease | None = None
        """Fences nothing: a non-durable store is never shared (kept for the node to read)."""

    def new_lease(
        self, worker: WorkerInfo | None, lease_seconds: float, *, shared: bool = False
    ) -> None:
        """No lease: a non-durable store is never shared."""
        return None

    def count(self, table_name: str) -> int:
        """Rows in a table, by the SQL table's name."""
        tables = self.tables
        sizes = {
            "node_checkpoints": len(tables.checkpoints),
            "node_message_ids": len(tables.message_ids),
            "node_outbox": len(tables.outbox),
            "node_flow_results": sum(o.error is None for o in tables.outcomes.values()),
            "node_flow_exceptions": sum(o.error is not None for o in tables.outcomes.values()),
            "node_dead_letters": len(tables.dead_letters),
        }
        return sizes[table_name]

    def close(self) -> None:
        """Nothing to release."""
