"""The node database through SQLAlchemy Core: checkpoints, dedup ids, outbox, results.

:class:`NodeDatabase` implements the state machine's ``CheckpointStore`` protocol and the
outbox relay's ``OutboxStore``. SQLite is the default (WAL journal, ``synchronous=FULL`` so a
commit survives power loss); PostgreSQL works through the same code.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
from sqlalchemy import (
    Connection,
    Engine,
    MetaData,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Transaction
from sqlalchemy.schema import CreateSchema, DropSchema

from persistence import schema
from persistence.bounded import bounded_reason, bounded_text
from persistence.checkpoint_codec import decode_checkpoint, encode_checkpoint
from persistence.lease import NodeLease, WorkerInfo
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
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import Receive, Sleep
from statemachine.limits import MESSAGE_ID_CHARS, PARTY_NAME_CHARS
from statemachine.ports import InboundMessage, OutboxRow
from statemachine.state import Checkpoint, FlowStatus, StartedLocally

QUERY_CHUNK = 500

CHECKPOINT_INTEGRITY_ERROR = "persistence.store.CheckpointIntegrityError"
"""The error class recorded for a flow whose checkpoint could not be trusted."""

MAC_CONTEXT = b"fiberflow-checkpoint-v2"
"""Domain separation of checkpoint MACs (v2: the version is bound in)."""

log = logging.getLogger("fiberflow.store")
"""Ids per ``IN (...)`` query (well under every backend's bound-parameter limit)."""


class SchemaVersionError(RuntimeError):
    """The database was made by another schema version of fiberflow."""


class FlowRequestClaimError(RuntimeError):
    """A flow request was claimed twice (only possible without the lease: a bug)."""


@attrs.frozen
class CheckpointSummary:
    """One row of ``node_checkpoints``, as ``node.checkpoints()`` reports it."""

    flow_id: str
    flow_class: str
    status: str


@attrs.frozen
class FlowRequest:
    """A client's request that the node start a flow; the flow's id will be ``request_id``."""

    request_id: str
    flow_class: str
    arguments: bytes


@attrs.frozen
class StoredOutcome:
    """A finished flow's stored result or error."""

    flow_id: str
    flow_class: str
    result: bytes | None
    error: FlowError | None


def _waiting_for(checkpoint: Checkpoint) -> tuple[str | None, str | None]:
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

    def __init__(self, database: NodeDatabase, connection: Connection) -> None:
        self._database = database
        self._connection = connection
        self._transaction: Transaction = connection.begin()
        try:
            database.check_fence(connection)
        except BaseException:
            self.rollback()
            raise

    def put_checkpoints(self, actions: Sequence[PersistCheckpoint]) -> None:
        """Insert or replace checkpoint rows and blobs (the last one wins per flow)."""
        rows, blobs = [], []
        for action in actions:
            checkpoint = action.checkpoint
            blob = encode_checkpoint(checkpoint)
            self._database.note_checkpoint(checkpoint, len(blob))
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
                    "mac": self._database.checkpoint_mac(
                        checkpoint.flow_id, checkpoint.version, blob
                    ),
                }
            )
        self._database.upsert(self._connection, schema.node_checkpoints, rows, "flow_id")
        self._database.upsert(self._connection, schema.node_checkpoint_blobs, blobs, "flow_id")

    def remove_checkpoints(self, actions: Sequence[RemoveCheckpoint]) -> None:
        """Delete checkpoint rows and blobs, where present."""
        flow_ids = [action.flow_id for action in actions]
        for table in (schema.node_checkpoints, schema.node_checkpoint_blobs):
            for start in range(0, len(flow_ids), QUERY_CHUNK):
                chunk = flow_ids[start : start + QUERY_CHUNK]
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
            ids = list(action.request_ids)
            for start in range(0, len(ids), QUERY_CHUNK):
                chunk = ids[start : start + QUERY_CHUNK]
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
        """Commit and return the connection to the pool."""
        try:
            self._transaction.commit()
        finally:
            self._connection.close()

    def rollback(self) -> None:
        """Roll back and return the connection to the pool."""
        try:
            self._transaction.rollback()
        finally:
            self._connection.close()


class NodeDatabase:
    """A node's database: opens (and if new, creates) the schema at ``url``."""

    def __init__(
        self,
        url: str,
        *,
        synchronous: str = "FULL",
        schema_name: str | None = None,
        mac_key: bytes | None = None,
        application_name: str | None = None,
    ) -> None:
        """Open the database; with ``mac_key``, checkpoint blobs carry and need a MAC.

        ``application_name`` names the connections on PostgreSQL (a node process uses
        :func:`persistence.lease.application_name` of its worker id).
        """
        self.url = normalize_url(url)
        self._mac_key = mac_key
        self.schema_name = schema_name
        self.lease: NodeLease | None = None
        """The lease every write of the node's flows is fenced by (None: not fenced)."""
        self.checkpoints_written = 0
        """Checkpoints written (inserted or replaced) through this object."""
        self.checkpoint_listeners: list[Callable[[Checkpoint, int], None]] = []
        """Called with each checkpoint written and its blob size (demos, tracing)."""
        connect_args: dict[str, Any] = {}
        if application_name is not None and self.url.startswith("postgresql"):
            connect_args["application_name"] = application_name
        engine = create_engine(self.url, connect_args=connect_args)
        if engine.dialect.name == "sqlite":
            if schema_name is not None:
                raise ValueError("a schema name is for PostgreSQL; SQLite keeps a node per file")
            configure_sqlite(engine, synchronous)
        elif schema_name is not None:
            with engine.begin() as connection:
                connection.execute(CreateSchema(schema_name, if_not_exists=True))
            engine = engine.execution_options(schema_translate_map={None: schema_name})
        self.engine: Engine = engine
        self.writer: Engine = engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        """The engine for write transactions (on SQLite they take the write lock at BEGIN)."""
        self._create_schema()

    def _create_schema(self) -> None:
        if self._schema_is_current():
            return  # nothing to create: no write lock taken (a busy node may hold it)
        create_tables(self.engine, schema.metadata)
        immediate = self.engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        with immediate.begin() as connection:
            versions = connection.execute(select(schema.node_schema_version.c.version)).scalars()
            found = list(versions)
            if not found:
                connection.execute(
                    insert(schema.node_schema_version).values(
                        version=schema.SCHEMA_VERSION, applied_at=millis(time.time())
                    )
                )
            elif found != [schema.SCHEMA_VERSION]:
                raise SchemaVersionError(
                    f"{self.url} has schema version {found}, this fiberflow needs "
                    f"{schema.SCHEMA_VERSION}"
                )

    def _schema_is_current(self) -> bool:
        """True if every table exists and the schema version is this fiberflow's (a read)."""
        with self.engine.connect() as connection:
            present = set(inspect(connection).get_table_names())
            if not set(schema.metadata.tables) <= present:
                return False
            versions = connection.execute(select(schema.node_schema_version.c.version))
            return list(versions.scalars()) == [schema.SCHEMA_VERSION]

    def note_checkpoint(self, checkpoint: Checkpoint, size: int) -> None:
        """Count a checkpoint write and tell the listeners."""
        self.checkpoints_written += 1
        for listener in self.checkpoint_listeners:
            listener(checkpoint, size)

    def upsert(
        self, connection: Connection, table: Any, rows: Sequence[dict[str, Any]], key: str
    ) -> None:
        """Insert ``rows``, replacing existing rows with the same ``key`` (later rows win)."""
        if not rows:
            return
        dialect = self.engine.dialect.name
        module: Any = {"sqlite": sqlite, "postgresql": postgresql}.get(dialect)
        if module is None or len({row[key] for row in rows}) != len(rows):
            for row in rows:  # portable, and ordered when a key repeats
                connection.execute(delete(table).where(table.c[key] == row[key]))
                connection.execute(insert(table).values(**row))
            return
        statement = module.insert(table)
        updates = {c.name: statement.excluded[c.name] for c in table.columns if c.name != key}
        connection.execute(
            statement.on_conflict_do_update(index_elements=[key], set_=updates), rows
        )

    def check_fence(self, connection: Connection) -> None:
        """Inside a write transaction: raise ``LeaseLostError`` unless the lease still holds."""
        if self.lease is not None:
            self.lease.fence(connection)

    @contextlib.contextmanager
    def fenced(self) -> Iterator[Connection]:
        """A write transaction of the node, fenced by its lease (see :meth:`check_fence`)."""
        with self.writer.begin() as connection:
            self.check_fence(connection)
            yield connection

    def check_lease(self) -> None:
        """Raise ``LeaseLostError`` unless the node still holds its lease (writes nothing)."""
        if self.lease is not None:
            with self.fenced():
                pass

    def new_lease(self, worker: WorkerInfo | None, lease_seconds: float) -> NodeLease:
        """A (not yet acquired) lease of this database for ``worker`` (this process)."""
        return NodeLease(self.engine, worker, lease_seconds, immediate=self.writer)

    def begin(self) -> SqlTransaction:
        """Open a write transaction (fenced by the lease, if the node holds one)."""
        return SqlTransaction(self, self.writer.connect())

    def is_consumed(self, message_id: str) -> bool:
        """True if this inbound message id was recorded by a committed transaction."""
        return bool(self.consumed_among([message_id]))

    def consumed_among(self, message_ids: Sequence[str]) -> set[str]:
        """The ids among ``message_ids`` recorded by committed transactions.

        One query per ``QUERY_CHUNK`` ids.
        """
        table = schema.node_message_ids
        found: set[str] = set()
        with self.engine.connect() as connection:
            for start in range(0, len(message_ids), QUERY_CHUNK):
                chunk = list(message_ids[start : start + QUERY_CHUNK])
                query = select(table.c.message_id).where(table.c.message_id.in_(chunk))
                found.update(connection.execute(query).scalars())
        return found

    def checkpoint_mac(self, flow_id: str, version: int, blob: bytes) -> bytes | None:
        """The MAC of version ``version`` of a flow's checkpoint blob (None without a key).

        It binds the blob to its flow and to its version: a blob moved to another flow, or
        an older blob put back, does not match the row it sits in.
        """
        if self._mac_key is None:
            return None
        message = b"\0".join((MAC_CONTEXT, flow_id.encode(), str(version).encode(), blob))
        return hmac.new(self._mac_key, message, "sha256").digest()

    def load_checkpoints(self, flow_ids: Sequence[str] | None = None) -> list[Checkpoint]:
        """Every stored checkpoint, oldest first.

        A checkpoint is not trusted if its MAC does not match (the blob was changed, moved
        from another flow, or an older version of it was put back), if it does not decode,
        or if it is older than what the node committed for its flow since: the flow has a
        stored outcome (it finished), or messages were recorded as consumed on its sessions
        that the checkpoint does not know. An untrusted flow comes back HOSPITALIZED with the
        reason (its row says so too; the blob is kept as found, for the operator).
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
        with self.engine.connect() as connection:
            found = connection.execute(query).all()
            decoded = {
                row.flow_id: self._trusted_checkpoint(
                    row.flow_id, row.checkpoint_version, row.blob, row.mac
                )
                for row in found
            }
            trusted = {f: c for f, (c, problem) in decoded.items() if c is not None}
            stale = checkpoint_staleness(connection, list(trusted.values()))
        checkpoints = []
        for row in found:
            checkpoint, problem = decoded[row.flow_id]
            problem = problem or stale.get(row.flow_id)
            if problem is not None:
                checkpoint = self._hospitalize_untrusted(row, problem)
            assert checkpoint is not None
            hospitalized = FlowStatus.HOSPITALIZED
            if row.status == hospitalized.value and checkpoint.status is not hospitalized:
                # Kept for observation by the node (its row says so): it stays kept.
                reason = row.error_message or "kept in the hospital"
                error = FlowError(ErrorKind.INTERNAL, "flows.errors.FlowFailedError", reason)
                checkpoint = attrs.evolve(checkpoint, status=hospitalized, error=error)
            checkpoints.append(checkpoint)
        return checkpoints

    def _trusted_checkpoint(
        self, flow_id: str, version: int, blob: bytes, mac: bytes | None
    ) -> tuple[Checkpoint | None, str | None]:
        expected = self.checkpoint_mac(flow_id, version, blob)
        if expected is not None and (mac is None or not hmac.compare_digest(expected, mac)):
            return None, self._mac_problem(flow_id, version, blob, mac)
        try:
            checkpoint = decode_checkpoint(blob)
        except Exception as error:  # a blob that breaks the decoder in any way is untrusted
            return None, f"undecodable checkpoint: {type(error).__name__}: {error}"
        if checkpoint.flow_id != flow_id:
            return None, f"the checkpoint stored for {flow_id} is flow {checkpoint.flow_id}'s"
        if checkpoint.version != version:
            return None, (
                f"stale checkpoint: its blob is version {checkpoint.version}, its row says the "
                f"node committed version {version}"
            )
        return checkpoint, None

    def _mac_problem(self, flow_id: str, version: int, blob: bytes, mac: bytes | None) -> str:
        """Why a MAC does not match: an older version put back, or a changed blob."""
        if mac is not None:
            with contextlib.suppress(Exception):
                older = decode_checkpoint(blob).version
                if older < version and hmac.compare_digest(
                    mac, self.checkpoint_mac(flow_id, older, blob) or b""
                ):
                    return (
                        f"stale checkpoint: an older genuine checkpoint (version {older}) was "
                        f"put back, the node committed version {version}"
                    )
        return (
            "checkpoint MAC does not match: the blob was changed outside this node "
            "(or written with another key)"
        )

    def mark_status(self, flow_id: str, status: FlowStatus, reason: str | None) -> None:
        """Set the status (and error message) shown in a flow's row; its blob is not touched."""
        table = schema.node_checkpoints
        with self.fenced() as connection:
            connection.execute(
                update(table)
                .where(table.c.flow_id == flow_id)
                .values(status=status.value, error_message=reason)
            )

    def mark_hospitalized(self, flow_id: str, reason: str) -> None:
        """Show a flow as HOSPITALIZED with the reason in its row (its blob is not touched)."""
        table = schema.node_checkpoints
        with self.fenced() as connection:
            connection.execute(
                update(table)
                .where(table.c.flow_id == flow_id)
                .values(status=FlowStatus.HOSPITALIZED.value, error_message=reason)
            )

    def _hospitalize_untrusted(self, row: Any, reason: str) -> Checkpoint:
        log.error("flow %s kept in the hospital: %s", row.flow_id, reason)
        self.mark_hospitalized(row.flow_id, reason)
        return Checkpoint(
            flow_id=row.flow_id,
            origin=StartedLocally(row.flow_class, b""),
            status=FlowStatus.HOSPITALIZED,
            created_at=row.created_at / 1000,
            error=FlowError(ErrorKind.INTERNAL, CHECKPOINT_INTEGRITY_ERROR, reason),
        )

    def checkpoint_summaries(self) -> list[CheckpointSummary]:
        """(flow id, flow class, status) of every stored checkpoint, oldest first."""
        table = schema.node_checkpoints
        query = select(table.c.flow_id, table.c.flow_class, table.c.status).order_by(
            table.c.created_at, table.c.flow_id
        )
        with self.engine.connect() as connection:
            return [CheckpointSummary(*row) for row in connection.execute(query)]

    def stored_outcome(self, flow_id: str) -> StoredOutcome | None:
        """The kept result or error of a finished flow, or None."""
        results, errors = schema.node_flow_results, schema.node_flow_exceptions
        with self.engine.connect() as connection:
            row = connection.execute(
                select(results.c.flow_class, results.c.result).where(results.c.flow_id == flow_id)
            ).first()
            if row is not None:
                return StoredOutcome(flow_id, row.flow_class, row.result, None)
            row = connection.execute(select(errors).where(errors.c.flow_id == flow_id)).first()
        if row is None:
            return None
        error = FlowError(ErrorKind(row.error_kind), row.exception_class, row.message)
        return StoredOutcome(flow_id, row.flow_class, None, error)

    def stored_outcomes(self, flow_ids: Sequence[str]) -> dict[str, StoredOutcome]:
        """The kept outcomes of those of ``flow_ids`` that have finished."""
        results, errors = schema.node_flow_results, schema.node_flow_exceptions
        found: dict[str, StoredOutcome] = {}
        with self.engine.connect() as connection:
            for start in range(0, len(flow_ids), QUERY_CHUNK):
                chunk = list(flow_ids[start : start + QUERY_CHUNK])
                query = select(results.c.flow_id, results.c.flow_class, results.c.result)
                for row in connection.execute(query.where(results.c.flow_id.in_(chunk))):
                    found[row.flow_id] = StoredOutcome(
                        row.flow_id, row.flow_class, row.result, None
                    )
                for row in connection.execute(select(errors).where(errors.c.flow_id.in_(chunk))):
                    error = FlowError(ErrorKind(row.error_kind), row.exception_class, row.message)
                    found[row.flow_id] = StoredOutcome(row.flow_id, row.flow_class, None, error)
        return found

    def dead_letter(self, message: InboundMessage, reason: str, at: float) -> None:
        """Keep an unprocessable message with the reason (its own transaction).

        Whatever the message holds, the record fits: its id and sender are stored as bounded
        copies (:func:`persistence.bounded.bounded_text`: cut to the column, with a digest of
        the whole), the reason is cut to ``limits.DEAD_LETTER_REASON_CHARS``, and the payload is
        kept whole (frames are bounded by ``limits.FRAME_BYTES``).
        """
        with self.fenced() as connection:
            connection.execute(
                insert(schema.node_dead_letters).values(
                    message_id=bounded_text(message.message_id, MESSAGE_ID_CHARS),
                    sender=bounded_text(message.sender, PARTY_NAME_CHARS),
                    reason=bounded_reason(reason),
                    payload=bytes(message.data),
                    received_at=millis(at),
                )
            )

    def pending_outbox(self) -> list[OutboxRow]:
        """Every outbox row, oldest first (what a starting relay must send)."""
        table = schema.node_outbox
        query = select(table.c.message_id, table.c.target, table.c.payload).order_by(
            table.c.created_at, table.c.message_id
        )
        with self.engine.connect() as connection:
            return [OutboxRow(*row) for row in connection.execute(query)]

    def delete_outbox(self, message_ids: Sequence[str]) -> None:
        """Delete outbox rows the transport has durably taken."""
        if not message_ids:
            return
        table = schema.node_outbox
        with self.engine.begin() as connection:
            connection.execute(delete(table).where(table.c.message_id.in_(list(message_ids))))

    def request_flows(self, requests: Sequence[FlowRequest], at: float) -> None:
        """Ask the node to start flows (one transaction; an existing request id is kept)."""
        table = schema.node_flow_requests
        rows = [
            {
                "request_id": r.request_id,
                "flow_class": r.flow_class,
                "arguments": r.arguments,
                "requested_at": millis(at),
                "started_at": None,
            }
            for r in requests
        ]
        if not rows:
            return
        module: Any = {"sqlite": sqlite, "postgresql": postgresql}[self.engine.dialect.name]
        with self.engine.begin() as connection:
            for start in range(0, len(rows), QUERY_CHUNK):
                connection.execute(
                    module.insert(table).on_conflict_do_nothing(index_elements=["request_id"]),
                    rows[start : start + QUERY_CHUNK],
                )

    def pending_flow_requests(self, limit: int) -> list[FlowRequest]:
        """Requested flows not started yet, oldest first."""
        table = schema.node_flow_requests
        query = (
            select(table.c.request_id, table.c.flow_class, table.c.arguments)
            .where(table.c.started_at.is_(None))
            .order_by(table.c.requested_at, table.c.request_id)
            .limit(limit)
        )
        with self.engine.connect() as connection:
            return [FlowRequest(*row) for row in connection.execute(query)]

    def known_flows(self, flow_ids: Sequence[str]) -> set[str]:
        """Those of ``flow_ids`` that have a checkpoint or a stored outcome (one query each)."""
        found: set[str] = set()
        tables = (schema.node_checkpoints, schema.node_flow_results, schema.node_flow_exceptions)
        with self.engine.connect() as connection:
            for start in range(0, len(flow_ids), QUERY_CHUNK):
                chunk = list(flow_ids[start : start + QUERY_CHUNK])
                for table in tables:
                    query = select(table.c.flow_id).where(table.c.flow_id.in_(chunk))
                    found.update(connection.execute(query).scalars())
        return found

    def request_operation(self, action: str, flow_id: str | None, at: float) -> str:
        """Queue an operator command for the node; returns its request id."""
        request_id = uuid.uuid4().hex
        with self.engine.begin() as connection:
            connection.execute(
                insert(schema.node_operator_requests).values(
                    request_id=request_id,
                    action=action,
                    flow_id=flow_id,
                    requested_at=millis(at),
                )
            )
        return request_id

    def pending_operations(self) -> list[tuple[str, str, str | None]]:
        """(request id, action, flow id) of operator commands not yet carried out."""
        table = schema.node_operator_requests
        query = (
            select(table.c.request_id, table.c.action, table.c.flow_id)
            .where(table.c.done_at.is_(None))
            .order_by(table.c.requested_at, table.c.request_id)
        )
        with self.engine.connect() as connection:
            return [(r.request_id, r.action, r.flow_id) for r in connection.execute(query)]

    def finish_operation(self, request_id: str, outcome: str, at: float) -> None:
        """Record what an operator command did."""
        table = schema.node_operator_requests
        with self.fenced() as connection:
            connection.execute(
                update(table)
                .where(table.c.request_id == request_id)
                .values(done_at=millis(at), outcome=outcome)
            )

    def operation_outcome(self, request_id: str) -> str | None:
        """What an operator command did, or None while the node has not done it."""
        table = schema.node_operator_requests
        with self.engine.connect() as connection:
            row = connection.execute(
                select(table.c.outcome).where(table.c.request_id == request_id)
            ).first()
        return None if row is None else row.outcome

    def set_paused(self, flow_id: str, paused: bool, at: float) -> None:
        """Remember (or forget) that ``flow_id`` is paused, across restarts."""
        table = schema.node_paused_flows
        with self.fenced() as connection:
            connection.execute(delete(table).where(table.c.flow_id == flow_id))
            if paused:
                connection.execute(insert(table).values(flow_id=flow_id, paused_at=millis(at)))

    def set_setting(self, name: str, value: str | None, at: float) -> None:
        """Store (or with None, remove) a node-wide setting, across restarts."""
        table = schema.node_settings
        with self.fenced() as connection:
            connection.execute(delete(table).where(table.c.name == name))
            if value is not None:
                connection.execute(
                    insert(table).values(name=name, value=value, updated_at=millis(at))
                )

    def setting(self, name: str) -> str | None:
        """A node-wide setting, or None if it is not set."""
        table = schema.node_settings
        with self.engine.connect() as connection:
            found = connection.execute(select(table.c.value).where(table.c.name == name))
            return found.scalar_one_or_none()

    def note_busy_flow(self, flow_id: str, since: float, location: str) -> None:
        """Record that ``flow_id``'s code has been running since ``since`` (at ``location``).

        Written by the node process's watchdog thread, outside the lease's fencing: it is a
        note for operators, never a fact flows depend on.
        """
        table = schema.node_running_flows
        row = {
            "flow_id": flow_id,
            "since": millis(since),
            "location": location[:2000],
            "noted_at": millis(time.time()),
        }
        with self.writer.begin() as connection:
            self.upsert(connection, table, [row], "flow_id")

    def clear_busy_flow(self, flow_id: str) -> None:
        """Forget the note of :meth:`note_busy_flow` (the flow suspended or stopped)."""
        table = schema.node_running_flows
        with self.writer.begin() as connection:
            connection.execute(delete(table).where(table.c.flow_id == flow_id))

    def busy_flows(self) -> dict[str, tuple[int, str]]:
        """Flow id -> (running since, in ms; location) of the flows noted as running long."""
        table = schema.node_running_flows
        with self.engine.connect() as connection:
            rows = connection.execute(select(table.c.flow_id, table.c.since, table.c.location))
            return {row.flow_id: (row.since, row.location) for row in rows}

    def paused_flows(self) -> set[str]:
        """The flows operators paused."""
        table = schema.node_paused_flows
        with self.engine.connect() as connection:
            return set(connection.execute(select(table.c.flow_id)).scalars())

    def load_checkpoint(self, flow_id: str) -> Checkpoint | None:
        """One stored checkpoint (checked like :meth:`load_checkpoints`), or None."""
        for checkpoint in self.load_checkpoints(flow_ids=[flow_id]):
            return checkpoint
        return None

    def has_checkpoint(self, flow_id: str) -> bool:
        """True if ``flow_id`` has a stored checkpoint."""
        table = schema.node_checkpoints
        with self.engine.connect() as connection:
            found = connection.execute(select(table.c.flow_id).where(table.c.flow_id == flow_id))
            return found.first() is not None

    def count(self, table_name: str) -> int:
        """Number of rows in one of the node tables (for reports and tests)."""
        table = schema.metadata.tables[table_name]
        with self.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(table)).scalar_one())

    def close(self) -> None:
        """Release every connection."""
        self.engine.dispose()


_PERMANENT_CONNECT_PROBLEMS = (
    "does not exist",  # a missing database or role
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "unable to open database file",  # SQLite: a missing directory, or no right to write
    "invalid dsn",
    "invalid connection option",
)


def is_permanent_connect_error(error: BaseException) -> bool:
    """True if connecting failed for a reason waiting will not cure.

    Permanent: a wrong password, a missing database or role, a SQLite file that cannot be
    opened. Not permanent: refused, timed out, the server starting up or full.
    """
    text = str(getattr(error, "orig", None) or error).lower()
    return any(problem in text for problem in _PERMANENT_CONNECT_PROBLEMS)


def checkpoint_staleness(
    connection: Connection, checkpoints: Sequence[Checkpoint]
) -> dict[str, str]:
    """Why each of ``checkpoints`` is older than what the node committed for its flow.

    Facts the node writes in the same transactions as its checkpoints: a finished flow's
    stored outcome, and the dedup id of every message a flow consumed. A checkpoint whose
    flow has an outcome, or that does not know a message recorded as consumed on one of its
    sessions, is stale. Flows not in the result are fresh.
    """
    problems: dict[str, str] = {}
    ids = [c.flow_id for c in checkpoints]
    for table, what in (
        (schema.node_flow_results, "completed"),
        (schema.node_flow_exceptions, "failed"),
    ):
        for start in range(0, len(ids), QUERY_CHUNK):
            chunk = ids[start : start + QUERY_CHUNK]
            for flow_id in connection.execute(
                select(table.c.flow_id).where(table.c.flow_id.in_(chunk))
            ).scalars():
                problems[flow_id] = (
                    f"stale checkpoint: the flow already {what} (its outcome is stored); a "
                    "finished flow's checkpoint never runs again"
                )
    expected: dict[str, tuple[str, int, frozenset[int]]] = {}
    for checkpoint in checkpoints:
        for session in checkpoint.sessions:
            early = frozenset(e.sequence for e in session.early)
            expected[session.session_id] = (
                checkpoint.flow_id,
                session.next_receive_sequence,
                early,
            )
    table = schema.node_message_ids
    sessions = list(expected)
    for start in range(0, len(sessions), QUERY_CHUNK):
        chunk = sessions[start : start + QUERY_CHUNK]
        query = (
            select(table.c.session_id, table.c.sequence)
            .where(table.c.session_id.in_(chunk))
            .order_by(table.c.session_id, table.c.sequence)
        )
        for session_id, sequence in connection.execute(query):
            flow_id, next_receive, early = expected[session_id]
            if sequence >= next_receive and sequence not in early and flow_id not in problems:
                problems[flow_id] = (
                    f"stale checkpoint: message {sequence} of session {session_id} was "
                    f"consumed, but this checkpoint expects message {next_receive} next"
                )
    return problems


def normalize_url(url: str) -> str:
    """Pick psycopg (version 3) for plain ``postgresql://`` URLs; leave others alone."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def drop_schema(url: str, schema_name: str) -> None:
    """Drop a PostgreSQL schema and everything in it (tests and tools)."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(DropSchema(schema_name, cascade=True, if_exists=True))
    finally:
        engine.dispose()


SQLITE_BEGIN_OPTION = "fiberflow_sqlite_begin"
"""Execution option: ``"IMMEDIATE"`` makes a SQLite transaction take the write lock at BEGIN."""


def create_tables(engine: Engine, metadata: MetaData) -> None:
    """``metadata.create_all`` safely while other processes may be doing the same."""
    immediate = engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
    with immediate.begin() as connection:
        metadata.create_all(connection)


def _switch_to_wal(cursor: Any) -> None:
    """Set WAL mode; retried, since SQLite does not wait on the lock this needs.

    (Two processes opening a new database file at once: one converts it to WAL while the
    other gets "database is locked" at once, busy timeout or not.)
    """
    delay = 0.005
    for attempt in range(12):
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or attempt == 11:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def configure_sqlite(engine: Engine, synchronous: str) -> None:
    """WAL, the given ``synchronous`` level, a 10 s busy timeout, and explicit BEGIN."""
    if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves, below
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=10000")  # first: the others may wait for a lock
        _switch_to_wal(cursor)
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # A transaction that reads before it writes must say so up front (IMMEDIATE):
        # SQLite cannot upgrade a read lock while another connection writes, and fails
        # at once with "database is locked" instead of waiting.
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "")
        connection.exec_driver_sql(f"BEGIN {mode}".strip())
