"""The node database: opens the engine and the schema, and holds the parts that use them.

:class:`NodeDatabase` is what a node, a client or an operator tool opens. Its parts, one job
each, share one :class:`~persistence.fencing.FencedEngine` (so one lease fences them all):

* ``checkpoints`` (:mod:`persistence.checkpoint_store`): the state machine's
  ``CheckpointStore``: transactions, checkpoints, dedup ids, outcomes, dead letters;
* ``outbox`` (:mod:`persistence.outbox`): what the outbox relays send and delete;
* ``control`` (:mod:`persistence.control_plane`): flow requests, operator requests, paused
  flows, settings, busy-flow notes.

SQLite is the default (WAL journal, ``synchronous=FULL`` so a commit survives power loss);
PostgreSQL works through the same code, with a schema per node (:mod:`foundation.engine`).
The non-durable store with the same parts is :mod:`persistence.memory_store`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Connection, Engine, func, insert, make_url, select

from foundation.engine import lock_schema_creation, normalize_url, open_engine, write_engine
from persistence import schema
from persistence.checkpoint_store import SqlCheckpointStore
from persistence.control_plane import SqlControlPlane
from persistence.fencing import FencedEngine
from persistence.lease import NodeLease
from persistence.migration import (
    NodeDatabaseMissingError,
    SchemaVersionError,
    check_revision,
    head_revision,
    node_tables,
    stamp_head,
    stored_revision,
    where,
)
from persistence.outbox import SqlOutbox
from persistence.schedule_store import SqlSchedules
from persistence.schema import millis
from persistence.worker_process import WorkerInfo


class NodeDatabase:
    """A node's database: opens the schema at ``url`` (and, with ``create``, makes a new one)."""

    durable = True
    """What is committed survives the process."""

    def __init__(
        self,
        url: str,
        *,
        synchronous: str = "FULL",
        schema_name: str | None = None,
        mac_key: bytes | None = None,
        application_name: str | None = None,
        create: bool = True,
    ) -> None:
        """Open the database; with ``mac_key``, checkpoint blobs carry and need a MAC.

        ``application_name`` names the connections on PostgreSQL (a node process uses
        :func:`persistence.lease.application_name` of its worker id). ``create``: make the
        node tables if there are none (a node does; clients and operator tools pass False
        and get :class:`NodeDatabaseMissingError`, naming the URL, for a missing SQLite file
        or a database or schema without the node tables, so a typo creates nothing).
        Either way a database of another schema version raises :class:`SchemaVersionError`.
        """
        self.url = normalize_url(url)
        self.schema_name = schema_name
        if not create:
            require_sqlite_file(self.url)
        engine = open_engine(
            self.url,
            synchronous=synchronous,
            schema_name=schema_name,
            application_name=application_name,
            create_schema=create,
        )
        try:
            if create:
                create_node_schema(engine, self.url, schema_name)
            else:
                open_node_schema(engine, self.url, schema_name)
        except BaseException:
            engine.dispose()
            raise
        self._fence = FencedEngine(engine)
        self.engine: Engine = engine
        """The engine (for PostgreSQL, translated to the node's schema)."""
        self.outbox = SqlOutbox(self._fence)
        """The outbox relays' ``OutboxStore``."""
        self.checkpoints = SqlCheckpointStore(self._fence, mac_key, self.outbox.waiting)
        """The state machine's ``CheckpointStore`` (its transactions delete the outbox rows
        queued by ``outbox.delete_later``)."""
        self.control = SqlControlPlane(self._fence)
        """The operator control plane."""
        self.schedules = SqlSchedules(self._fence)
        """Flows started on a schedule (:mod:`flows.node.schedules`)."""

    @property
    def lease(self) -> NodeLease | None:
        """The lease every write of the node's flows is fenced by (None: not fenced)."""
        return self._fence.lease

    @lease.setter
    def lease(self, lease: NodeLease | None) -> None:
        self._fence.lease = lease

    def new_lease(
        self, worker: WorkerInfo | None, lease_seconds: float, *, shared: bool = False
    ) -> NodeLease:
        """A (not yet acquired) lease of this database for ``worker`` (this process).

        ``shared``: the worker is one of several running the node (PostgreSQL only).
        """
        return self._fence.new_lease(worker, lease_seconds, shared=shared)

    @contextlib.contextmanager
    def fenced(self) -> Iterator[Connection]:
        """A write transaction of the node, fenced by its lease."""
        with self._fence.fenced() as connection:
            yield connection

    def count(self, table_name: str) -> int:
        """Number of rows in one of the node tables (for reports and tests)."""
        table = schema.metadata.tables[table_name]
        with self.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(table)).scalar_one())

    def close(self) -> None:
        """Release every connection."""
        self.engine.dispose()


def require_sqlite_file(url: str) -> None:
    """Raise :class:`NodeDatabaseMissingError` if ``url`` names a SQLite file that is not there.

    (Connecting would create it.) Other databases are left to :func:`open_node_schema`.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        raise NodeDatabaseMissingError(
            f"no node database at {where(url, None)}: a node's SQLite database is a file"
        )
    if not Path(database).is_file():
        raise NodeDatabaseMissingError(
            f"no node database at {where(url, None)}: the file {database} does not exist (a "
            "node creates it when it first runs: fiberflow node run)"
        )


def open_node_schema(engine: Engine, url: str, schema_name: str | None = None) -> None:
    """Check that the node tables are there, at this fiberflow's schema version (a read).

    Raises :class:`NodeDatabaseMissingError` if the database (or schema) has no node tables,
    :class:`SchemaVersionError` if it has another schema version.
    """
    with engine.connect() as connection:
        revision = stored_revision(connection, schema_name)
    if revision is None:
        raise NodeDatabaseMissingError(
            f"no node database at {where(url, schema_name)}: it has no node tables (a node "
            "creates them when it first runs: fiberflow node run)"
        )
    check_revision(revision, where(url, schema_name))


def create_node_schema(engine: Engine, url: str, schema_name: str | None = None) -> None:
    """Create the node tables in an empty database, at the newest version; check the version.

    A new database gets every table of :mod:`persistence.schema`, ``node_schema_version`` =
    :data:`~persistence.schema.SCHEMA_VERSION` and ``alembic_version`` at the newest revision.
    Raises :class:`SchemaVersionError` if the database has another schema version (older:
    the message names the command that upgrades it). A database that is already current is
    only read: no write lock is taken (a busy node may hold it).
    """
    with engine.connect() as connection:
        revision = stored_revision(connection, schema_name)
    if revision is None:
        with write_engine(engine).begin() as connection:
            lock_schema_creation(connection, schema_name)
            revision = stored_revision(connection, schema_name)  # another process made it?
            if revision is None:
                schema.metadata.create_all(connection)
                connection.execute(
                    insert(schema.node_schema_version).values(
                        version=schema.SCHEMA_VERSION, applied_at=millis(time.time())
                    )
                )
                stamp_head(connection, schema_name)
                revision = head_revision()
    check_revision(revision, where(url, schema_name))


__all__ = [
    "NodeDatabase",
    "NodeDatabaseMissingError",
    "SchemaVersionError",
    "create_node_schema",
    "node_tables",
    "open_node_schema",
]
