"""One transaction of the state machine on the node database (``StoreTransaction``).

Everything a group of transitions decided is written here, all or nothing: checkpoints (row
and sealed blob), dedup ids of consumed messages, outbox rows, finished flows' outcomes, and
the claims of client flow requests. Each checkpoint, result and error row carries the facts of
its flow's sessions (``session_facts``: :func:`session_facts_text`) in the same statement.
The transaction's first statement checks the node's lease (:mod:`persistence.fencing`); its
last deletes the outbox rows the relay has handed to the transport since the previous
transaction (:class:`persistence.outbox.WaitingDeletes`).

On PostgreSQL, once the lease check has come back, the writes are sent without waiting for
each (:class:`persistence.pipeline.Pipeline`) and ``COMMIT`` follows them in the same round
trip: a transaction costs two round trips whatever it writes, one more if it records
consumed message ids (a consumed id is refused when it is recorded: the writes queued so far
are waited for then) and one more if it claims flow requests (their count is checked before
the commit).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, String, Table, any_, bindparam, delete, insert, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Transaction

from foundation.engine import chunks, upsert, upsert_statement
from persistence import schema
from persistence.checkpoint_codec import encode_checkpoint, forget_journals
from persistence.checkpoint_trust import CheckpointSeal
from persistence.fencing import FencedEngine
from persistence.outbox import WaitingDeletes
from persistence.pipeline import Pipeline
from persistence.schema import millis
from persistence.sqlite_writes import SqliteWrites
from statemachine.actions import (
    ClaimFlowRequests,
    PersistCheckpoint,
    RecordInboundMessages,
    RecordStatus,
    RemoveCheckpoint,
    StoreFlowError,
    StoreFlowResult,
)
from statemachine.iorequests import Receive, RunOperation, Sleep
from statemachine.ports import OutboxRow
from statemachine.session_facts import SessionFacts, session_facts
from statemachine.state import Checkpoint


class FlowRequestClaimError(RuntimeError):
    """A flow request was claimed twice (only possible without the lease: a bug)."""


WAITING_ROWS = ("Receive", "Sleep")
"""``suspended_on`` values of a flow that needs nothing until a message or its deadline."""


def _waiting_for(checkpoint: Checkpoint) -> tuple[str | None, str | None]:
    """The ``suspended_on`` and ``waiting_for`` columns of a checkpoint's row."""
    pending = checkpoint.pending
    if pending is None:
        return None, None
    if isinstance(pending.request, Sleep):
        return "Sleep", json.dumps({"until": millis(pending.deadline or 0)})
    if isinstance(pending.request, RunOperation):
        request = pending.request
        waits_for = {
            "operation": request.name,
            "label": request.label,
            "attempt": request.attempt,
            "state": "backing off" if request.backing_off else "running",
            "until": None if pending.deadline is None else millis(pending.deadline),
        }
        return "Operation", json.dumps(waits_for)
    assert isinstance(pending.request, Receive)
    waits = []
    for session_id in pending.request.session_ids:
        session = checkpoint.session(session_id)
        counterparty = session.counterparty if session is not None else None
        waits.append({"session": session_id, "counterparty": counterparty})
    return "Receive", json.dumps(waits)


def session_facts_text(facts: Sequence[SessionFacts]) -> str:
    """The ``session_facts`` column: one JSON object per session, in order.

    ``[{"session": id, "sent": n, "received": n, "confirmed": true or false}, ...]``
    (``[]`` for a flow without sessions): see :mod:`statemachine.session_facts`.
    """
    entries = [
        f'{{"session":{json.dumps(f.session_id)},"sent":{f.sent:d},"received":{f.received:d},'
        f'"confirmed":{"true" if f.confirmed else "false"}}}'
        for f in facts
    ]
    return "[" + ",".join(entries) + "]"


def _wake_at(checkpoint: Checkpoint) -> int | None:
    """The ``wake_at`` column: the deadline (epoch milliseconds) the flow waits for, if any."""
    pending = checkpoint.pending
    if pending is None or pending.deadline is None:
        return None
    return millis(pending.deadline)


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
        self._fence = fence
        self._written: list[str] = []
        """The flows whose checkpoints this transaction writes or removes."""
        self._note_checkpoint = note_checkpoint
        self._waiting_deletes = waiting_deletes
        self._connection = fence.writer.connect()
        self._transaction: Transaction = self._connection.begin()
        self._pipeline: Pipeline | None = None
        self._sqlite: SqliteWrites | None = None
        self._claims: list[tuple[Any, list[str]]] = []  # (its cursor, the ids), pipelined
        self._ended = False
        try:
            fence.check_fence(self._connection)
            if self._connection.dialect.name == "postgresql":
                self._pipeline = Pipeline(self._connection)
            elif self._connection.dialect.name == "sqlite":
                self._sqlite = SqliteWrites(self._connection)
        except BaseException:
            self.rollback()
            raise

    def _insert(self, table: Table, rows: Sequence[dict[str, Any]]) -> None:
        """Insert ``rows`` (each with the same columns) into ``table``."""
        if not rows:
            return
        statement = _insert_statement(table, tuple(rows[0]))
        if self._pipeline is not None:
            self._pipeline.execute(statement, rows)
        elif self._sqlite is not None:
            self._sqlite.execute_many(statement, rows)
        else:
            self._connection.execute(statement, rows)

    def _upsert(self, table: Table, rows: Sequence[dict[str, Any]], key: str) -> None:
        """Insert or replace ``rows`` of ``table`` by ``key`` (a later row wins)."""
        if self._pipeline is None and self._sqlite is None:
            upsert(self._connection, table, rows, key)
            return
        last = list({row[key]: row for row in rows}.values())  # a key once: the last row
        statement = upsert_statement(self._connection.dialect.name, table, key)
        if self._pipeline is not None:
            self._pipeline.execute(statement, last)
        elif self._sqlite is not None:
            self._sqlite.execute_many(statement, last)

    def _delete(self, table: Table, key: str, ids: Sequence[str]) -> None:
        """Delete the rows of ``table`` whose ``key`` is one of ``ids``."""
        if not ids:
            return
        if self._pipeline is not None:
            self._pipeline.execute(_delete_statement(table, key), {"ids": list(ids)})
        elif self._sqlite is not None:
            self._sqlite.delete_many(table, key, ids)
        else:
            statement = _expanding_delete(table, key)
            for chunk in chunks(ids):
                self._connection.execute(statement, {"ids": chunk})

    def put_checkpoints(self, actions: Sequence[PersistCheckpoint]) -> None:
        """Insert or replace checkpoint rows and blobs (the last one wins per flow)."""
        rows, blobs = [], []
        self._written.extend(action.checkpoint.flow_id for action in actions)
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
                    "wake_at": _wake_at(checkpoint),
                    "journal_length": len(checkpoint.journal),
                    "checkpoint_bytes": len(blob),
                    "checkpoint_version": checkpoint.version,
                    "error_message": checkpoint.error.message if checkpoint.error else None,
                    "created_at": millis(checkpoint.created_at),
                    "updated_at": millis(action.at),
                    "session_facts": session_facts_text(session_facts(checkpoint.sessions)),
                }
            )
            blobs.append(
                {
                    "flow_id": checkpoint.flow_id,
                    "blob": blob,
                    "mac": self._seal.mac(checkpoint.flow_id, checkpoint.version, blob),
                }
            )
        self._upsert(schema.node_checkpoints, rows, "flow_id")
        self._upsert(schema.node_checkpoint_blobs, blobs, "flow_id")

    def remove_checkpoints(self, actions: Sequence[RemoveCheckpoint]) -> None:
        """Delete checkpoint rows and blobs, where present."""
        flow_ids = [action.flow_id for action in actions]
        self._written.extend(flow_ids)
        for table in (schema.node_checkpoints, schema.node_checkpoint_blobs):
            self._delete(table, "flow_id", flow_ids)
        forget_journals(flow_ids)

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
        self._insert(schema.node_message_ids, rows)
        if self._pipeline is not None:
            self._pipeline.sync()  # a consumed id is refused here, as the port promises

    def write_outbox(self, rows: Sequence[tuple[OutboxRow, float]]) -> None:
        """Insert encoded outbound messages with the time they were decided."""
        self._insert(
            schema.node_outbox,
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
        self._insert(
            schema.node_flow_results,
            [
                {
                    "flow_id": a.flow_id,
                    "flow_class": a.flow_class,
                    "result": a.result,
                    "completed_at": millis(a.at),
                    "session_facts": session_facts_text(a.sessions),
                }
                for a in actions
            ],
        )

    def store_errors(self, actions: Sequence[StoreFlowError]) -> None:
        """Keep failed flows' errors."""
        self._insert(
            schema.node_flow_exceptions,
            [
                {
                    "flow_id": a.flow_id,
                    "flow_class": a.flow_class,
                    "error_kind": a.error.kind.value,
                    "exception_class": a.error.exception_class,
                    "message": a.error.message,
                    "failed_at": millis(a.at),
                    "traceback": a.traceback or None,
                    "session_facts": session_facts_text(a.sessions),
                }
                for a in actions
            ],
        )

    def record_statuses(self, actions: Sequence[RecordStatus]) -> None:
        """Set the status and reason shown in each flow's row (blobs are not touched)."""
        table = schema.node_checkpoints
        if self._pipeline is not None:
            rows = [
                {"b_flow_id": a.flow_id, "b_status": a.status.value, "b_reason": a.reason}
                for a in actions
            ]
            self._pipeline.execute(_STATUS_UPDATE, rows)
            return
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
            if self._pipeline is not None and action.request_ids:
                ids = list(action.request_ids)
                parameters = {"ids": ids, "at": millis(action.at)}
                self._claims.append((self._pipeline.execute(_CLAIM, parameters), ids))
                continue
            for chunk in chunks(action.request_ids):
                result = self._connection.execute(
                    update(table)
                    .where(table.c.request_id.in_(chunk), table.c.started_at.is_(None))
                    .values(started_at=millis(action.at))
                )
                _check_claimed(chunk, result.rowcount)

    def _end_pipeline(self) -> None:
        """Wait for the queued writes, check the claims, write one by one from now on."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.close()
            self._check_claims()

    def _check_claims(self) -> None:
        claims, self._claims = self._claims, []
        for cursor, ids in claims:
            _check_claimed(ids, cursor.rowcount)

    @property
    def handle(self) -> Connection:
        """The transaction's connection (flow side effects write through it).

        On PostgreSQL what was queued is waited for first.
        """
        self._end_pipeline()
        return self._connection

    def commit(self) -> None:
        """Delete the outbox rows waiting for a transaction, commit, return the connection.

        If the commit fails, the rows wait for the next transaction.
        """
        waiting = self._waiting_deletes
        try:
            self._fence.check_writes(self._written)
        except BaseException:
            self.rollback()
            raise
        taken = waiting.take() if waiting is not None else []
        pipeline = self._pipeline
        try:
            self._delete(schema.node_outbox, "message_id", taken)
            if pipeline is not None:
                if self._claims:
                    pipeline.sync()  # the claims are checked before anything commits
                    self._check_claims()
                self._pipeline = None
                pipeline.commit()  # COMMIT behind the writes: one round trip for all
            self._transaction.commit()
        except BaseException:
            self._pipeline = None
            if pipeline is not None:
                pipeline.abandon()
            if waiting is not None:
                waiting.give_back(taken)
            raise
        finally:
            self._ended = True
            self._connection.close()  # (after a failure: the transaction is rolled back)

    def rollback(self) -> None:
        """Roll back and return the connection to the pool (nothing to do once ended)."""
        if self._ended:
            return
        self._ended = True
        pipeline, self._pipeline = self._pipeline, None
        try:
            if pipeline is not None:
                pipeline.abandon()
            self._transaction.rollback()
        finally:
            self._connection.close()


def _check_claimed(request_ids: Sequence[str], claimed: int) -> None:
    """Raise unless every one of ``request_ids`` was claimed (``claimed`` rows updated)."""
    if claimed != len(request_ids):
        raise FlowRequestClaimError(
            f"{len(request_ids) - claimed} of flow requests {list(request_ids)[:3]}... were "
            "already started (or withdrawn) by another transaction"
        )


_INSERTS: dict[tuple[Table, tuple[str, ...]], Any] = {}
_DELETES: dict[tuple[Table, str, str], Any] = {}


def _insert_statement(table: Table, columns: tuple[str, ...]) -> Any:
    """``INSERT INTO table (columns) VALUES (:column, ...)``, built once."""
    statement = _INSERTS.get((table, columns))
    if statement is None:
        statement = insert(table).values({name: bindparam(name) for name in columns})
        _INSERTS[(table, columns)] = statement
    return statement


def _expanding_delete(table: Table, key: str) -> Any:
    """``DELETE FROM table WHERE key IN (:ids)`` (the ids a list), built once."""
    statement = _DELETES.get((table, key, "in"))
    if statement is None:
        statement = delete(table).where(table.c[key].in_(bindparam("ids", expanding=True)))
        _DELETES[(table, key, "in")] = statement
    return statement


def _delete_statement(table: Table, key: str) -> Any:
    """``DELETE FROM table WHERE key = ANY(:ids)`` (PostgreSQL: the ids in one array)."""
    statement = _DELETES.get((table, key, "any"))
    if statement is None:
        ids = bindparam("ids", type_=ARRAY(String))
        statement = delete(table).where(table.c[key] == any_(ids))
        _DELETES[(table, key, "any")] = statement
    return statement


_STATUS_UPDATE = (
    update(schema.node_checkpoints)
    .where(schema.node_checkpoints.c.flow_id == bindparam("b_flow_id"))
    .values(status=bindparam("b_status"), error_message=bindparam("b_reason"))
)
_CLAIM = (
    update(schema.node_flow_requests)
    .where(
        schema.node_flow_requests.c.request_id == any_(bindparam("ids", type_=ARRAY(String))),
        schema.node_flow_requests.c.started_at.is_(None),
    )
    .values(started_at=bindparam("at"))
)
