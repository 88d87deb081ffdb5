"""One transaction of the state machine on the node database (``StoreTransaction``).

Everything a group of transitions decided is written here, all or nothing: checkpoints (row
and sealed blob), dedup ids of consumed messages, outbox rows, finished flows' outcomes, and
the claims of client flow requests. The transaction's first statement checks the node's lease
(:mod:`persistence.fencing`); its last deletes the outbox rows the relay has handed to the
transport since the previous transaction (:class:`persistence.outbox.WaitingDeletes`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from sqlalchemy import Connection, delete, insert, update
from sqlalchemy.engine import Transaction

from persistence import schema
from persistence.checkpoint_codec import encode_checkpoint
from persistence.checkpoint_trust import CheckpointSeal
from persistence.engine import chunks, upsert
from persistence.fencing import FencedEngine
from persistence.outbox import WaitingDeletes, delete_rows
from persistence.schema import millis
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
from statemachine.ports import OutboxRow
from statemachine.state import Checkpoint


class FlowRequestClaimError(RuntimeError):
    """A flow request was claimed twice (only possible without the lease: a bug)."""


def _waiting_for(checkpoint: Checkpoint) -> tuple[str | None, str | None]:
    """The ``suspended_on`` and ``waiting_for`` columns of a checkpoint's row."""
    pending = checkpoint.pending
    if pending is None:
        return None, None
    if isinstance(pending.request, Sleep):
        return "Sleep", json.dumps({"until": millis(pending.deadline or 0)})
    assert isinstance(pending.request, Receive)
    waits = []
    for session_id in pending.request.session_ids:
        session = checkpoint.session(session_id)
        counterparty = session.counterparty if session is not None else None
        waits.append({"session": session_id, "counterparty": counterparty})
    return "Receive", json.dumps(waits)


class SqlTransaction:
    """One open transaction on the node database (see ``StoreTransaction``).

    Each method takes every action of its kind from a group of transitions and writes them
    with one ``executemany`` statement per table.
    """

    def __init__(
        self,
        fence: FencedEngine,
        seal: CheckpointSeal,
        note_checkpoint: Callable[[Checkpoint, int], None],
        waiting_deletes: WaitingDeletes | None = None,
    ) -> None:
        """Begin on a connection of ``fence``'s writer; raises if the lease no longer holds.

        ``seal`` makes the blobs' MACs; ``note_checkpoint`` is told of each checkpoint written
        and its blob size; the outbox rows queued in ``waiting_deletes`` are deleted at commit.
        """
        self._seal = seal
        self._note_checkpoint = note_checkpoint
        self._waiting_deletes = waiting_deletes
        self._connection = fence.writer.connect()
        self._transaction: Transaction = self._connection.begin()
        try:
            fence.check_fence(self._connection)
        except BaseException:
            self.rollback()
            raise

    def put_checkpoints(self, actions: Sequence[PersistCheckpoint]) -> None:
        """Insert or replace checkpoint rows and blobs (the last one wins per flow)."""
        rows, blobs = [], []
        for action in actions:
            checkpoint = action.checkpoint
            blob = encode_checkpoint(checkpoint)
            self._note_checkpoint(checkpoint, len(blob))
            suspended_on, waiting_for = _waiting_for(checkpoint)
            rows.append(
                {
                    "flow_id": checkpoint.flow_id,
                    "flow_class": checkpoint.flow_class,
                    "status": checkpoint.status.value,
                    "progress_step": checkpoint.progress_step,
                    "suspended_on": suspended_on,
                    "waiting_for": waiting_for,
                    "journal_length": len(checkpoint.journal),
                    "checkpoint_bytes": len(blob),
                    "checkpoint_version": checkpoint.version,
                    "error_message": checkpoint.error.message if checkpoint.error else None,
                    "created_at": millis(checkpoint.created_at),
                    "updated_at": millis(action.at),
                }
            )
            blobs.append(
                {
                    "flow_id": checkpoint.flow_id,
                    "blob": blob,
                    "mac": self._seal.mac(checkpoint.flow_id, checkpoint.version, blob),
                }
            )
        upsert(self._connection, schema.node_checkpoints, rows, "flow_id")
        upsert(self._connection, schema.node_checkpoint_blobs, blobs, "flow_id")

    def remove_checkpoints(self, actions: Sequence[RemoveCheckpoint]) -> None:
        """Delete checkpoint rows and blobs, where present."""
        flow_ids = [action.flow_id for action in actions]
        for table in (schema.node_checkpoints, schema.node_checkpoint_blobs):
            for chunk in chunks(flow_ids):
                self._connection.execute(delete(table).where(table.c.flow_id.in_(chunk)))

    def record_inbound(self, actions: Sequence[RecordInboundMessages]) -> None:
        """Insert dedup ids; the primary key refuses an id consumed twice."""
        rows = [
            {
                "message_id": r.message_id,
                "sender": r.sender,
                "session_id": r.session_id,
                "sequence": r.sequence,
                "inserted_at": millis(action.at),
            }
            for action in actions
            for r in action.records
        ]
        self._connection.execute(insert(schema.node_message_ids), rows)

    def write_outbox(self, rows: Sequence[tuple[OutboxRow, float]]) -> None:
        """Insert encoded outbound messages with the time they were decided."""
        self._connection.execute(
            insert(schema.node_outbox),
            [
                {
                    "message_id": row.message_id,
                    "target": row.target,
                    "payload": row.data,
                    "created_at": millis(at),
                }
                for row, at in rows
            ],
        )

    def store_results(self, actions: Sequence[StoreFlowResult]) -> None:
        """Keep finished flows' results."""
        self._connection.execute(
            insert(schema.node_flow_results),
            [
                {
                    "flow_id": a.flow_id,
                    "flow_class": a.flow_class,
                    "result": a.result,
                    "completed_at": millis(a.at),
                }
                for a in actions
            ],
        )

    def store_errors(self, actions: Sequence[StoreFlowError]) -> None:
        """Keep failed flows' errors."""
        self._connection.execute(
            insert(schema.node_flow_exceptions),
            [
                {
                    "flow_id": a.flow_id,
                    "flow_class": a.flow_class,
                    "error_kind": a.error.kind.value,
                    "exception_class": a.error.exception_class,
                    "message": a.error.message,
                    "failed_at": millis(a.at),
                }
                for a in actions
            ],
        )

    def record_statuses(self, actions: Sequence[RecordStatus]) -> None:
        """Set the status and reason shown in each flow's row (blobs are not touched)."""
        table = schema.node_checkpoints
        for action in actions:
            self._connection.execute(
                update(table)
                .where(table.c.flow_id == action.flow_id)
                .values(status=action.status.value, error_message=action.reason)
            )

    def claim_flow_requests(self, actions: Sequence[ClaimFlowRequests]) -> None:
        """Mark requested flows started; refuses a request already started by anyone."""
        table = schema.node_flow_requests
        for action in actions:
            for chunk in chunks(action.request_ids):
                result = self._connection.execute(
                    update(table)
                    .where(table.c.request_id.in_(chunk), table.c.started_at.is_(None))
                    .values(started_at=millis(action.at))
                )
                if result.rowcount != len(chunk):
                    raise FlowRequestClaimError(
                        f"{len(chunk) - result.rowcount} of flow requests {chunk[:3]}... were "
                        "already started (or withdrawn) by another transaction"
                    )

    @property
    def handle(self) -> Connection:
        """The transaction's connection (flow side effects write through it)."""
        return self._connection

    def commit(self) -> None:
        """Delete the outbox rows waiting for a transaction, commit, return the connection.

        If the commit fails, the rows wait for the next transaction.
        """
        waiting = self._waiting_deletes
        taken = waiting.take() if waiting is not None else []
        try:
            if taken:
                delete_rows(self._connection, taken)
            self._transaction.commit()
        except BaseException:
            if waiting is not None:
                waiting.give_back(taken)
            raise
        finally:
            self._connection.close()

    def rollback(self) -> None:
        """Roll back and return the connection to the pool."""
        try:
            self._transaction.rollback()
        finally:
            self._connection.close()
