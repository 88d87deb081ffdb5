"""The state machine's ``CheckpointStore`` on the node database.

Transactions (:mod:`persistence.sql_transaction`), the checkpoints they wrote, loaded back
with their trust checked (:mod:`persistence.checkpoint_trust`), the dedup ids of consumed
messages, finished flows' outcomes, dead letters, and the status an operator sees in a flow's
row. Every write is fenced by the node's lease (:mod:`persistence.fencing`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import insert, select

from foundation.bounded import bounded_reason, bounded_text
from foundation.engine import chunks
from persistence import schema
from persistence.checkpoint_trust import CheckpointSeal, checkpoint_staleness
from persistence.fencing import FencedEngine
from persistence.node_store import CheckpointSummary, StoredOutcome
from persistence.outbox import WaitingDeletes
from persistence.schema import millis
from persistence.sql_transaction import WAITING_ROWS, SqlTransaction
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.limits import MESSAGE_ID_CHARS, PARTY_NAME_CHARS
from statemachine.ports import InboundMessage
from statemachine.state import Checkpoint, FlowStatus, IndexEntry, StoredFlow

log = logging.getLogger("fiberflow.store")


class SqlCheckpointStore:
    """The ``CheckpointStore`` port (and the node's reads of outcomes) on SQL tables."""

    def __init__(
        self,
        fence: FencedEngine,
        mac_key: bytes | None,
        waiting_deletes: WaitingDeletes | None = None,
    ) -> None:
        """With ``mac_key``, checkpoint blobs carry and need a MAC.

        Each transaction deletes the outbox rows queued in ``waiting_deletes`` as it commits.
        """
        self._fence = fence
        self._waiting_deletes = waiting_deletes
        self._seal = CheckpointSeal(mac_key)
        self.checkpoints_written = 0
        """Checkpoints written (inserted or replaced) through this object."""
        self.checkpoint_listeners: list[Callable[[Checkpoint, int], None]] = []
        """Called with each checkpoint written and its blob size (demos, tracing)."""

    def note_checkpoint(self, checkpoint: Checkpoint, size: int) -> None:
        """Count a checkpoint write and tell the listeners."""
        self.checkpoints_written += 1
        for listener in self.checkpoint_listeners:
            listener(checkpoint, size)

    def checkpoint_mac(self, flow_id: str, version: int, blob: bytes) -> bytes | None:
        """The MAC of version ``version`` of a flow's checkpoint blob (None without a key)."""
        return self._seal.mac(flow_id, version, blob)

    def begin(self) -> SqlTransaction:
        """Open a write transaction (fenced by the lease, if the node holds one)."""
        return SqlTransaction(self._fence, self._seal, self.note_checkpoint, self._waiting_deletes)

    def check_lease(self) -> None:
        """Raise ``LeaseLostError`` unless the node still holds its lease (writes nothing)."""
        self._fence.check_lease()

    def is_consumed(self, message_id: str) -> bool:
        """True if this inbound message id was recorded by a committed transaction."""
        return bool(self.consumed_among([message_id]))

    def consumed_among(self, message_ids: Sequence[str]) -> set[str]:
        """The ids among ``message_ids`` recorded by committed transactions.

        One query per ``QUERY_CHUNK`` ids.
        """
        table = schema.node_message_ids
        found: set[str] = set()
        with self._fence.reader.connect() as connection:
            for chunk in chunks(message_ids):
                query = select(table.c.message_id).where(table.c.message_id.in_(chunk))
                found.update(connection.execute(query).scalars())
        return found

    def load_checkpoints(self, flow_ids: Sequence[str] | None = None) -> list[StoredFlow]:
        """What is stored of every flow (of ``flow_ids``), oldest first: facts, not acted on.

        A checkpoint is not trusted if its MAC does not match (the blob was changed, moved
        from another flow, or an older version of it was put back), if it does not decode,
        or if it is older than what the node committed for its flow since: the flow has a
        stored outcome (it finished), or messages were recorded as consumed on its sessions
        that the checkpoint does not know. Then ``checkpoint`` is None and ``problem`` says
        why; the blob is left as found, for the operator. Nothing is written: the transition
        (:class:`~statemachine.events.LoadFlow`) decides what becomes of the flow.
        """
        rows, blobs = schema.node_checkpoints, schema.node_checkpoint_blobs
        query = (
            select(
                rows.c.flow_id,
                rows.c.flow_class,
                rows.c.created_at,
                rows.c.status,
                rows.c.error_message,
                rows.c.checkpoint_version,
                blobs.c.blob,
                blobs.c.mac,
            )
            .join(rows, rows.c.flow_id == blobs.c.flow_id)
            .order_by(rows.c.created_at, rows.c.flow_id)
        )
        if flow_ids is not None:
            query = query.where(rows.c.flow_id.in_(list(flow_ids)))
        with self._fence.engine.connect() as connection:
            found = connection.execute(query).all()
            decoded = {
                row.flow_id: self._seal.open(row.flow_id, row.checkpoint_version, row.blob, row.mac)
                for row in found
            }
            trusted = [c for c, _ in decoded.values() if c is not None]
            stale = checkpoint_staleness(connection, trusted)
        stored = []
        for row in found:
            checkpoint, problem = decoded[row.flow_id]
            problem = problem or stale.get(row.flow_id)
            stored.append(
                StoredFlow(
                    flow_id=row.flow_id,
                    flow_class=row.flow_class,
                    created_at=row.created_at / 1000,
                    row_status=FlowStatus(row.status),
                    row_reason=row.error_message,
                    checkpoint=None if problem is not None else checkpoint,
                    problem=problem,
                )
            )
        return stored

    def checkpoint_index(self) -> list[IndexEntry]:
        """An entry per stored checkpoint, oldest first, from the rows alone (no blob read).

        A flow whose row says it is suspended on a receive or a sleep is ``waiting``.
        """
        rows = schema.node_checkpoints
        query = select(rows.c.flow_id, rows.c.status, rows.c.suspended_on, rows.c.wake_at)
        query = query.order_by(rows.c.created_at, rows.c.flow_id)
        with self._fence.reader.connect() as connection:
            return [
                IndexEntry(
                    flow_id,
                    status == FlowStatus.SUSPENDED.value and suspended_on in WAITING_ROWS,
                    None if wake_at is None else wake_at / 1000,
                )
                for flow_id, status, suspended_on, wake_at in connection.execute(query)
            ]

    def load_checkpoint(self, flow_id: str) -> StoredFlow | None:
        """What is stored of one flow (see :meth:`load_checkpoints`), or None."""
        for stored in self.load_checkpoints(flow_ids=[flow_id]):
            return stored
        return None

    def has_checkpoint(self, flow_id: str) -> bool:
        """True if ``flow_id`` has a stored checkpoint."""
        table = schema.node_checkpoints
        with self._fence.reader.connect() as connection:
            found = connection.execute(select(table.c.flow_id).where(table.c.flow_id == flow_id))
            return found.first() is not None

    def checkpoint_summaries(
        self, flow_ids: Sequence[str] | None = None
    ) -> list[CheckpointSummary]:
        """(flow id, flow class, status) of each stored checkpoint (of ``flow_ids``).

        Oldest first.
        """
        table = schema.node_checkpoints
        query = select(table.c.flow_id, table.c.flow_class, table.c.status).order_by(
            table.c.created_at, table.c.flow_id
        )
        if flow_ids is not None:
            query = query.where(table.c.flow_id.in_(list(flow_ids)))
        with self._fence.reader.connect() as connection:
            return [CheckpointSummary(*row) for row in connection.execute(query)]

    def known_flows(self, flow_ids: Sequence[str]) -> set[str]:
        """Those of ``flow_ids`` that have a checkpoint or a stored outcome (one query each)."""
        found: set[str] = set()
        tables = (schema.node_checkpoints, schema.node_flow_results, schema.node_flow_exceptions)
        with self._fence.reader.connect() as connection:
            for chunk in chunks(flow_ids):
                for table in tables:
                    query = select(table.c.flow_id).where(table.c.flow_id.in_(chunk))
                    found.update(connection.execute(query).scalars())
        return found

    def stored_outcome(self, flow_id: str) -> StoredOutcome | None:
        """The kept result or error of a finished flow, or None."""
        results, errors = schema.node_flow_results, schema.node_flow_exceptions
        with self._fence.reader.connect() as connection:
            row = connection.execute(
                select(results.c.flow_class, results.c.result).where(results.c.flow_id == flow_id)
            ).first()
            if row is not None:
                return StoredOutcome(flow_id, row.flow_class, row.result, None)
            row = connection.execute(select(errors).where(errors.c.flow_id == flow_id)).first()
        if row is None:
            return None
        return _failed_outcome(row)

    def completed_flow_ids(self, flow_class: str | None = None) -> list[str]:
        """Ids of the flows that finished with a result, oldest first (by time, then id).

        With ``flow_class`` (a qualified class name), only the flows of that class.
        """
        table = schema.node_flow_results
        query = select(table.c.flow_id).order_by(table.c.completed_at, table.c.flow_id)
        if flow_class is not None:
            query = query.where(table.c.flow_class == flow_class)
        with self._fence.reader.connect() as connection:
            return list(connection.execute(query).scalars())

    def stored_outcomes(self, flow_ids: Sequence[str]) -> dict[str, StoredOutcome]:
        """The kept outcomes of those of ``flow_ids`` that have finished."""
        results, errors = schema.node_flow_results, schema.node_flow_exceptions
        found: dict[str, StoredOutcome] = {}
        with self._fence.reader.connect() as connection:
            for chunk in chunks(flow_ids):
                query = select(results.c.flow_id, results.c.flow_class, results.c.result)
                for row in connection.execute(query.where(results.c.flow_id.in_(chunk))):
                    found[row.flow_id] = StoredOutcome(
                        row.flow_id, row.flow_class, row.result, None
                    )
                for row in connection.execute(select(errors).where(errors.c.flow_id.in_(chunk))):
                    found[row.flow_id] = _failed_outcome(row)
        return found

    def dead_letter(self, message: InboundMessage, reason: str, at: float) -> None:
        """Keep an unprocessable message with the reason (its own transaction).

        Whatever the message holds, the record fits: its id and sender are stored as bounded
        copies (:func:`foundation.bounded.bounded_text`: cut to the column, with a digest of
        the whole), the reason is cut to ``limits.DEAD_LETTER_REASON_CHARS``, and the payload is
        kept whole (frames are bounded by ``limits.FRAME_BYTES``).
        """
        with self._fence.fenced() as connection:
            connection.execute(
                insert(schema.node_dead_letters).values(
                    message_id=bounded_text(message.message_id, MESSAGE_ID_CHARS),
                    sender=bounded_text(message.sender, PARTY_NAME_CHARS),
                    reason=bounded_reason(reason),
                    payload=bytes(message.data),
                    received_at=millis(at),
                )
            )


def _failed_outcome(row: Any) -> StoredOutcome:
    """The outcome a ``node_flow_exceptions`` row describes."""
    error = FlowError(ErrorKind(row.error_kind), row.exception_class, row.message)
    return StoredOutcome(row.flow_id, row.flow_class, None, error, row.traceback or "")
