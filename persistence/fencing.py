"""The one way the node database's parts write: fenced by the node's lease.

Every part of a node database (:mod:`persistence.checkpoint_store`,
:mod:`persistence.control_plane`, :mod:`persistence.outbox`) shares one :class:`FencedEngine`.
A write that changes the node's flows opens its transaction through :meth:`FencedEngine.fenced`
(or, for the state machine's transactions, calls :meth:`FencedEngine.check_fence` first): once
the node holds a lease (:mod:`persistence.lease`), that transaction's first statement checks
that the lease still holds, and a replaced process commits nothing. Setting the lease once, on
the shared object, fences every part.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator

from sqlalchemy import Connection, Engine

from foundation.engine import read_engine, write_engine
from persistence.lease import NodeLease
from persistence.worker_process import WorkerInfo


class FencedEngine:
    """A node database's engines and the lease its writes are fenced by."""

    def __init__(self, engine: Engine) -> None:
        """Wrap ``engine`` (for PostgreSQL, already translated to the node's schema)."""
        self.engine = engine
        """For reads of several statements that must agree, and for the writes that are not
        the node's (clients, operators)."""
        self.reader: Engine = read_engine(engine)
        """For reads of one statement each, on the same connections (on PostgreSQL in
        autocommit mode: one round trip each; see :func:`foundation.engine.read_engine`)."""
        self.writer: Engine = write_engine(engine)
        """The engine for write transactions (on SQLite they take the write lock at BEGIN)."""
        self.lease: NodeLease | None = None
        """The lease every write of the node's flows is fenced by (None: not fenced)."""

    def check_fence(self, connection: Connection) -> None:
        """Inside a write transaction: raise ``LeaseLostError`` unless the lease still holds."""
        if self.lease is not None:
            self.lease.fence(connection)

    def check_writes(self, flow_ids: Collection[str]) -> None:
        """Before a commit: raise unless the lease holds every written flow's partition.

        See :meth:`~persistence.lease.NodeLease.check_writes` (``PartitionNotHeldError``).
        """
        if self.lease is not None and flow_ids:
            self.lease.check_writes(flow_ids)

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

    def new_lease(
        self, worker: WorkerInfo | None, lease_seconds: float, *, shared: bool = False
    ) -> NodeLease:
        """A (not yet acquired) lease of this database for ``worker`` (this process).

        ``shared``: the worker is one of several running the node (PostgreSQL only).
        """
        return NodeLease(self.engine, worker, lease_seconds, immediate=self.writer, shared=shared)
