"""The node database: opens the engine and the schema, and holds the parts that use them.

:class:`NodeDatabase` is what a node, a client or an operator tool opens. Its parts, one job
each, share one :class:`~persistence.fencing.FencedEngine` (so one lease fences them all):

* ``checkpoints`` (:mod:`persistence.checkpoint_store`): the state machine's
  ``CheckpointStore``: transactions, checkpoints, dedup ids, outcomes, dead letters;
* ``outbox`` (:mod:`persistence.outbox`): what the outbox relays send and delete;
* ``control`` (:mod:`persistence.control_plane`): flow requests, operator requests, paused
  flows, settings, busy-flow notes.

SQLite is the default (WAL journal, ``synchronous=FULL`` so a commit survives power loss);
PostgreSQL works through the same code, with a schema per node (:mod:`persistence.engine`).
The non-durable store with the same parts is :mod:`persistence.memory_store`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from sqlalchemy import Connection, Engine, func, insert, select

from persistence import schema
from persistence.checkpoint_store import SqlCheckpointStore
from persistence.control_plane import SqlControlPlane
from persistence.engine import (
    create_tables,
    existing_tables,
    normalize_url,
    open_engine,
    write_engine,
)
from persistence.fencing import FencedEngine
from persistence.lease import NodeLease, WorkerInfo
from persistence.outbox import SqlOutbox
from persistence.schedule_store import SqlSchedules
from persistence.schema import millis


class SchemaVersionError(RuntimeError):
    """The database was made by another schema version of fiberflow."""


class NodeDatabase:
    """A node's database: opens (and if new, creates) the schema at ``url``."""

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
    ) -> None:
        """Open the database; with ``mac_key``, checkpoint blobs carry and need a MAC.

        ``application_name`` names the connections on PostgreSQL (a node process uses
        :func:`persistence.lease.application_name` of its worker id).
        """
        self.url = normalize_url(url)
        self.schema_name = schema_name
        engine = open_engine(
            self.url,
            synchronous=synchronous,
            schema_name=schema_name,
            application_name=application_name,
        )
        create_node_schema(engine, self.url)
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
        """Flows started on a schedule (:mod:`flows.schedules`)."""

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


def create_node_schema(engine: Engine, url: str) -> None:
    """Create the node tables if missing and check the schema version (``url`` names it).

    Raises :class:`SchemaVersionError` if the database was made by another schema version.
    A database that is already current is only read: no write lock is taken (a busy node
    may hold it).
    """
    if _schema_is_current(engine):
        return
    create_tables(engine, schema.metadata)
    with write_engine(engine).begin() as connection:
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
                f"{url} has schema version {found}, this fiberflow needs {schema.SCHEMA_VERSION}"
            )


def _schema_is_current(engine: Engine) -> bool:
    """True if every table exists and the schema version is this fiberflow's (a read)."""
    with engine.connect() as connection:
        present = existing_tables(connection)
        if not set(schema.metadata.tables) <= present:
            return False
        versions = connection.execute(select(schema.node_schema_version.c.version))
        return list(versions.scalars()) == [schema.SCHEMA_VERSION]
