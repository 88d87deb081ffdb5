"""The node database schema (SQLAlchemy Core). Documented column by column in docs/.

The width of every column that stores something that came from outside (a message id, a
node name, a session id, a flow id or class name) is its limit in :mod:`statemachine.limits`,
which the decoders enforce: what they let in always fits.

Timestamps are integer milliseconds since the Unix epoch (``BigInteger``), so that every
reader (SQL, Spark over JDBC, Arrow) sees the same plain number.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from statemachine.limits import (
    EXCEPTION_CLASS_CHARS,
    FLOW_CLASS_CHARS,
    FLOW_ID_CHARS,
    MESSAGE_ID_CHARS,
    PARTY_NAME_CHARS,
    PROGRESS_STEP_CHARS,
    SCHEDULE_ID_CHARS,
    SCHEDULE_SPEC_CHARS,
    SESSION_ID_CHARS,
    WORKER_NAME_CHARS,
)

SCHEMA_VERSION = 9
"""Bumped whenever a table or column changes, with a migration of the same number
(``persistence/migrations/versions``); a node refuses a database of another version."""

metadata = MetaData()

node_schema_version = Table(
    "node_schema_version",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("applied_at", BigInteger, nullable=False),
)

node_checkpoints = Table(
    "node_checkpoints",
    metadata,
    Column("flow_id", String(FLOW_ID_CHARS), primary_key=True),
    Column("flow_class", String(FLOW_CLASS_CHARS), nullable=False),
    Column("status", String(20), nullable=False),
    Column("progress_step", String(PROGRESS_STEP_CHARS)),
    Column("suspended_on", String(20)),
    Column("waiting_for", Text),
    Column("wake_at", BigInteger),
    Column("journal_length", Integer, nullable=False),
    Column("checkpoint_bytes", Integer, nullable=False),
    Column("checkpoint_version", BigInteger, nullable=False, default=0),
    Column("error_message", Text),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("session_facts", Text),
)

node_checkpoint_blobs = Table(
    "node_checkpoint_blobs",
    metadata,
    Column("flow_id", String(FLOW_ID_CHARS), primary_key=True),
    Column("blob", LargeBinary, nullable=False),
    Column("mac", LargeBinary, nullable=True),
)

node_flow_results = Table(
    "node_flow_results",
    metadata,
    Column("flow_id", String(FLOW_ID_CHARS), primary_key=True),
    Column("flow_class", String(FLOW_CLASS_CHARS), nullable=False),
    Column("result", LargeBinary, nullable=False),
    Column("completed_at", BigInteger, nullable=False),
    Column("session_facts", Text),
)

node_flow_exceptions = Table(
    "node_flow_exceptions",
    metadata,
    Column("flow_id", String(FLOW_ID_CHARS), primary_key=True),
    Column("flow_class", String(FLOW_CLASS_CHARS), nullable=False),
    Column("error_kind", String(30), nullable=False),
    Column("exception_class", String(EXCEPTION_CLASS_CHARS), nullable=False),
    Column("message", Text, nullable=False),
    Column("failed_at", BigInteger, nullable=False),
    Column("traceback", Text, nullable=True),
    Column("session_facts", Text),
)
"""``session_facts`` (here, in ``node_flow_results`` and in ``node_checkpoints``): the facts
of the flow's sessions (:mod:`statemachine.session_facts`) as JSON text, written with the
row (null in rows written before schema version 9)."""

node_message_ids = Table(
    "node_message_ids",
    metadata,
    Column("message_id", String(MESSAGE_ID_CHARS), primary_key=True),
    Column("sender", String(PARTY_NAME_CHARS), nullable=False),
    Column("session_id", String(SESSION_ID_CHARS), nullable=False),
    Column("sequence", BigInteger, nullable=False),
    Column("inserted_at", BigInteger, nullable=False),
    Index("node_message_ids_session", "session_id", "sequence"),
)

node_outbox = Table(
    "node_outbox",
    metadata,
    Column("message_id", String(MESSAGE_ID_CHARS), primary_key=True),
    Column("target", String(PARTY_NAME_CHARS), nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

node_dead_letters = Table(
    "node_dead_letters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(MESSAGE_ID_CHARS), nullable=False),
    Column("sender", String(PARTY_NAME_CHARS), nullable=False),
    Column("reason", Text, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("received_at", BigInteger, nullable=False),
)

node_flow_requests = Table(
    "node_flow_requests",
    metadata,
    Column("request_id", String(FLOW_ID_CHARS), primary_key=True),
    Column("flow_class", String(FLOW_CLASS_CHARS), nullable=False),
    Column("arguments", LargeBinary, nullable=False),
    Column("requested_at", BigInteger, nullable=False),
    Column("started_at", BigInteger, nullable=True, index=True),
    Column("partition", Integer, nullable=False, default=0),
)
"""Flows a client asked the node to start (the flow id is the request id: idempotent); the
partition of that flow id, so that each worker of a node run by several workers reads only
the requests it will start."""

node_operator_requests = Table(
    "node_operator_requests",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("action", String(20), nullable=False),
    Column("flow_id", String(FLOW_ID_CHARS), nullable=True),
    Column("requested_at", BigInteger, nullable=False),
    Column("done_at", BigInteger, nullable=True, index=True),
    Column("outcome", Text, nullable=True),
)
"""Operator commands for a running node (kill, pause, resume, retry a flow; drain)."""

node_paused_flows = Table(
    "node_paused_flows",
    metadata,
    Column("flow_id", String(FLOW_ID_CHARS), primary_key=True),
    Column("paused_at", BigInteger, nullable=False),
)
"""Flows an operator paused: they keep their place and messages but do not run."""

node_schedules = Table(
    "node_schedules",
    metadata,
    Column("schedule_id", String(SCHEDULE_ID_CHARS), primary_key=True),
    Column("flow_class", String(FLOW_CLASS_CHARS), nullable=False),
    Column("arguments", LargeBinary, nullable=False),
    Column("kind", String(10), nullable=False),
    Column("spec", String(SCHEDULE_SPEC_CHARS), nullable=False),
    Column("missed", String(10), nullable=False),
    Column("next_slot", BigInteger, nullable=True, index=True),
    Column("paused", Boolean, nullable=False),
    Column("fired", BigInteger, nullable=False),
    Column("last_slot", BigInteger, nullable=True),
    Column("created_at", BigInteger, nullable=False),
)
"""Flows started on a schedule (:mod:`flows.node.schedules`): once at a time, every so many seconds,
or by a cron expression (UTC). ``next_slot`` (ms) is the next slot not yet fired (null: a
one-off schedule that has fired); each slot fired is a flow request whose id is derived from
the schedule and the slot, so it starts exactly once."""

node_settings = Table(
    "node_settings",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Text, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)
"""Node-wide switches an operator set that must outlive a restart (``draining``)."""


node_workers = Table(
    "node_workers",
    metadata,
    Column("worker_id", String(64), primary_key=True),
    Column("pid", Integer, nullable=False),
    Column("host", String(255), nullable=False),
    Column("boot_id", String(64), nullable=False),
    Column("process_start", BigInteger, nullable=False),
    Column("pid_namespace", BigInteger, nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("renewed_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=False),
    Column("name", String(WORKER_NAME_CHARS), nullable=False, default=""),
    Column("shared", Boolean, nullable=False, default=False),
    Column("flow_counts", Text, nullable=True),
)
"""The processes running the node now, each with its lease (see :mod:`persistence.lease`)."""

node_partitions = Table(
    "node_partitions",
    metadata,
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("holder", String(64), nullable=True),
    Column("epoch", BigInteger, nullable=False),
    Column("acquired_at", BigInteger, nullable=True),
)
"""Which worker holds each partition of the node's flows, and its fencing epoch."""


node_running_flows = Table(
    "node_running_flows",
    metadata,
    Column("flow_id", String(FLOW_ID_CHARS), primary_key=True),
    Column("since", BigInteger, nullable=False),
    Column("location", Text, nullable=False),
    Column("noted_at", BigInteger, nullable=False),
)
"""Flows whose code has run longer than the node allows without suspending (the node
process's watchdog writes and clears these; ``fiberflow flow list`` shows them)."""


def millis(seconds: float) -> int:
    """Seconds since the epoch to the integer milliseconds the tables store."""
    return round(seconds * 1000)
