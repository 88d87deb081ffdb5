"""The node lease: which process may run a node's flows, fenced inside every commit.

A node's flows are divided into ``PARTITIONS`` partitions by flow id. What a node process (a
*worker*) holds is a lease on partitions: the right to run their flows. Today one process
holds all of them; the tables are laid out so that several workers of one node can later
share them (each partition is held by one worker at a time).

Tables (columns documented in docs/schema.md):

* ``node_workers``: one row per live worker: its id (a fresh random id per process start),
  process id, host, boot id and process start time (to tell a dead process from a live one
  on the same host), when it started, and when its lease expires. Times are milliseconds of
  the *database's* clock, so workers on several hosts agree on them.
* ``node_partitions``: one row per partition: the worker holding it and its *epoch*, a
  number bumped every time the partition changes hands.

Rules:

* :meth:`NodeLease.acquire` takes every partition in one transaction. A partition held by
  another worker is taken only if that worker's lease has expired, or the worker ran on this
  host and its process is gone (a SIGKILLed node restarts at once). Otherwise it raises
  :class:`LeaseHeldError`, naming the holder and since when. Taking a partition bumps its
  epoch and deletes the worker row of the previous holder.
* :meth:`NodeLease.fence` is the first statement of every transaction that changes the
  node's flows: it checks, under a lock that a takeover must wait for, that every partition
  the worker took still names it with the epoch it took. If not, the worker has been replaced
  (it was paused or cut off past its lease, and another process took over):
  :class:`LeaseLostError` rolls the transaction back, and the process must exit.
* :meth:`NodeLease.renew` extends the lease (a worker renews every third of the lease; a
  node process does it on a thread of its own, so long-running flow code cannot starve it).
  An expired lease nobody has taken over is renewed: its holder was never replaced.
* :meth:`NodeLease.release` frees the partitions at a clean stop.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Integer,
    bindparam,
    cast,
    delete,
    extract,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, OperationalError

from persistence import schema

log = logging.getLogger("fiberflow.lease")

PARTITIONS = 16
"""Partitions of a node's flows (fixed for a database: its rows are made with it)."""
DEFAULT_LEASE_SECONDS = 20.0
"""How long a worker's lease lasts without renewal."""
RETRY_RENEWAL_SECONDS = 0.5
"""After a failed renewal (the database went away for a moment), the next try comes soon."""
TAKEOVER_LOCK_TIMEOUT_MS = 2000
"""PostgreSQL: how long a takeover waits for a row lock held by an expired holder's backend
before ending that backend (a process frozen in the middle of a transaction)."""


class LeaseError(RuntimeError):
    """Something about the node lease prevents running the node."""


class LeaseHeldError(LeaseError):
    """Another live process holds the node's lease; this one must not start."""


class LeaseLostError(LeaseError):
    """The process no longer holds the node's lease: another took over. It must exit."""


def partition_of(flow_id: str) -> int:
    """The partition of a flow: CRC-32 of its id modulo :data:`PARTITIONS`."""
    return zlib.crc32(flow_id.encode()) % PARTITIONS


def database_now(connection: Connection) -> Any:
    """A SQL expression for the database's clock in integer milliseconds since the epoch."""
    if connection.dialect.name == "postgresql":
        return cast(func.floor(extract("epoch", func.clock_timestamp()) * 1000), BigInteger)
    return cast((func.julianday("now") - 2440587.5) * 86400000.0, Integer)


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux), or None if unknown."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 overall: starttime
    except (IndexError, ValueError):
        return None


@attrs.frozen
class WorkerInfo:
    """Who a worker is: enough to name it and to tell whether its process is still alive."""

    worker_id: str
    pid: int
    host: str
    boot_id: str
    process_start: int
    pid_namespace: int = 0
    """The inode of the process's PID namespace (0: unknown). Process ids of two
    containers on one host are comparable only within one namespace."""

    @classmethod
    def of_this_process(cls, worker_id: str | None = None) -> WorkerInfo:
        """Describe the calling process, under a fresh worker id (or ``worker_id``)."""
        pid = os.getpid()
        return cls(
            worker_id=worker_id or uuid.uuid4().hex,
            pid=pid,
            host=socket.gethostname()[:255],
            boot_id=_read_text("/proc/sys/kernel/random/boot_id") or "",
            process_start=process_start_ticks(pid) or 0,
            pid_namespace=_pid_namespace(),
        )

    def describe(self) -> str:
        """``pid 123 on host h (worker 3f2a9c1e)``."""
        return f"pid {self.pid} on host {self.host} (worker {self.worker_id[:8]})"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def process_is_gone(worker: WorkerInfo) -> bool:
    """True only if ``worker``'s process, on this host, no longer exists.

    Same host, same boot and same PID namespace are required to judge it: a worker in
    another PID namespace (another container) is never judged by its process id. A process
    id reused by another program counts as gone (its start time differs).
    """
    here = WorkerInfo.of_this_process("")
    if worker.host != here.host or not worker.boot_id or worker.boot_id != here.boot_id:
        return False
    if not worker.pid_namespace or worker.pid_namespace != here.pid_namespace:
        return False
    try:
        os.kill(worker.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, owned by another user
    started = process_start_ticks(worker.pid)
    return started is not None and worker.process_start != 0 and started != worker.process_start


def _utc(milliseconds: int) -> str:
    moment = datetime.datetime.fromtimestamp(milliseconds / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


@attrs.frozen
class Holder:
    """A worker holding (some of) the node's partitions, as its row says."""

    worker: WorkerInfo
    started_at: int
    renewed_at: int
    expires_at: int

    def describe(self, now: int) -> str:
        """Who holds the lease, since when, and for how much longer."""
        return (
            f"{self.worker.describe()} since {_utc(self.started_at)}, lease renewed "
            f"{(now - self.renewed_at) / 1000:.1f} s ago, expiring in "
            f"{(self.expires_at - now) / 1000:.1f} s"
        )


def _holder(row: Any) -> Holder:
    worker = WorkerInfo(
        row.worker_id, row.pid, row.host, row.boot_id, row.process_start, row.pid_namespace
    )
    return Holder(worker, row.started_at, row.renewed_at, row.expires_at)


class NodeLease:
    """One worker's lease on a node database (see the module docstring).

    ``engine`` is the node database's engine (for PostgreSQL, already translated to the
    node's schema). Nothing is held until :meth:`acquire`.
    """

    def __init__(
        self,
        engine: Engine,
        worker: WorkerInfo | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        *,
        immediate: Engine | None = None,
    ) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be positive, not {lease_seconds!r}")
        self.engine = engine
        self._immediate = immediate or engine
        self.worker = worker or WorkerInfo.of_this_process()
        self.lease_seconds = lease_seconds
        self.epochs: dict[int, int] = {}
        """The partitions held, with the epoch each was taken at."""
        self.taken_over_from: list[WorkerInfo] = []
        """Workers whose partitions :meth:`acquire` took (dead or expired)."""
        self._next_renewal = 0.0
        self._lock = threading.Lock()

    @property
    def worker_id(self) -> str:
        """The id of the worker holding (or meant to hold) the lease."""
        return self.worker.worker_id

    @property
    def held(self) -> bool:
        """True while partitions are held (acquired, not released)."""
        return bool(self.epochs)

    # --- acquiring ------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take every partition; raises :class:`LeaseHeldError` if a live worker holds one."""
        for attempt in range(1, 6):
            try:
                with self._immediate.begin() as connection:
                    self._acquire(connection)
                self._next_renewal = time.monotonic() + self.lease_seconds / 3
                self._end_sessions_of(self.taken_over_from)
                return
            except OperationalError as error:
                if attempt == 5 or not self._end_frozen_holders(error):
                    raise

    def _acquire(self, connection: Connection) -> None:
        partitions, workers = schema.node_partitions, schema.node_workers
        postgres = connection.dialect.name == "postgresql"
        now = int(connection.execute(select(database_now(connection))).scalar_one())
        if postgres:
            connection.execute(text(f"SET LOCAL lock_timeout = {TAKEOVER_LOCK_TIMEOUT_MS}"))
        _create_partitions(connection)
        query = select(partitions.c.partition, partitions.c.holder, partitions.c.epoch)
        if postgres:
            query = query.with_for_update()
        rows = connection.execute(query.order_by(partitions.c.partition)).all()
        holder_ids = {row.holder for row in rows if row.holder is not None}
        holders = {
            row.worker_id: _holder(row)
            for row in connection.execute(
                select(workers).where(workers.c.worker_id.in_(holder_ids))
            )
        }
        taken: list[WorkerInfo] = []
        for holder_id in sorted(holder_ids):
            holder = holders.get(holder_id)
            if holder is None:
                continue  # its worker row is gone: nobody holds these partitions
            if holder.expires_at <= now or process_is_gone(holder.worker):
                taken.append(holder.worker)
                continue
            raise LeaseHeldError(
                f"the node is already running: {holder.describe(now)}; refusing to start "
                "(two processes on one node would run its flows twice)"
            )
        expires = now + round(self.lease_seconds * 1000)
        connection.execute(
            insert(workers).values(
                worker_id=self.worker_id,
                pid=self.worker.pid,
                host=self.worker.host,
                boot_id=self.worker.boot_id,
                process_start=self.worker.process_start,
                pid_namespace=self.worker.pid_namespace,
                started_at=now,
                renewed_at=now,
                expires_at=expires,
            )
        )
        connection.execute(
            update(partitions).values(
                holder=self.worker_id, epoch=partitions.c.epoch + 1, acquired_at=now
            )
        )
        # Workers whose lease ran out long ago and hold nothing are forgotten too.
        connection.execute(
            delete(workers).where(
                workers.c.worker_id != self.worker_id,
                (workers.c.worker_id.in_([w.worker_id for w in taken]))
                | (workers.c.expires_at < now),
            )
        )
        self.epochs = {
            row.partition: row.epoch
            for row in connection.execute(select(partitions.c.partition, partitions.c.epoch))
        }
        self.taken_over_from = taken
        for worker in taken:
            log.warning(
                "took the node over from %s, whose lease expired or whose process is gone",
                worker.describe(),
            )

    def _end_sessions_of(self, workers: list[WorkerInfo]) -> None:
        """PostgreSQL: end every database session left by workers taken over.

        That fences them out of the node database, and of a SQL queue on the same server,
        at once.
        """
        if not workers or self.engine.dialect.name != "postgresql":
            return
        names = [application_name(worker.worker_id) for worker in workers]
        with self.engine.connect() as connection:
            ended = connection.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = ANY(:names) AND pid <> pg_backend_pid()"
                ),
                {"names": names},
            ).scalar_one()
            connection.commit()
        if ended:
            log.warning("ended %d database session(s) of the workers taken over", ended)

    def _end_frozen_holders(self, error: OperationalError) -> bool:
        """PostgreSQL: end the backends of expired holders that block a takeover.

        A holder frozen in the middle of a transaction (SIGSTOP, a paused VM) keeps its row
        locks; once its lease has expired its backends are ended so the takeover can proceed
        (when it thaws, its commits fail the fence). True if any backend was ended.
        """
        orig = getattr(error, "orig", None)
        if getattr(orig, "sqlstate", None) != "55P03":  # lock_not_available
            return False
        workers = schema.node_workers
        with self.engine.connect() as connection:
            now = int(connection.execute(select(database_now(connection))).scalar_one())
            stale = [
                _holder(row)
                for row in connection.execute(select(workers))
                if row.worker_id != self.worker_id
            ]
            ended = 0
            for holder in stale:
                if holder.expires_at > now and not process_is_gone(holder.worker):
                    raise LeaseHeldError(
                        f"the node is already running: {holder.describe(now)}; refusing to "
                        "start (two processes on one node would run its flows twice)"
                    ) from error
                ended += int(
                    connection.execute(
                        text(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE application_name = :name AND pid <> pg_backend_pid()"
                        ),
                        {"name": application_name(holder.worker.worker_id)},
                    ).scalar_one()
                )
            connection.commit()
        log.warning("ended %d database session(s) of expired lease holders", ended)
        return True

    # --- holding ----------------------------------------------------------------------------

    def fence(self, connection: Connection) -> None:
        """Check, inside a write transaction, that this worker still holds its partitions.

        On PostgreSQL the partition rows are locked (``FOR SHARE``): a takeover waits for this
        transaction to end. On SQLite the node's write transactions hold the write lock from
        their first statement (``BEGIN IMMEDIATE``). Raises :class:`LeaseLostError` if another
        worker took any partition over.
        """
        if not self.epochs:
            raise LeaseLostError(
                "this process holds no lease on the node (released or never taken)"
            )
        query = _FENCE_QUERIES[connection.dialect.name == "postgresql"]
        found = {row[0]: row[1] for row in connection.execute(query, {"holder": self.worker_id})}
        if found != self.epochs:
            lost = sorted(p for p, e in self.epochs.items() if found.get(p) != e)
            raise LeaseLostError(
                f"worker {self.worker_id[:8]} lost partitions {lost} of the node to another "
                "process (this one was paused or cut off past its lease); it must exit"
            )

    def renew(self) -> None:
        """Extend the lease by ``lease_seconds`` from now (database clock).

        Raises :class:`LeaseLostError` if another worker has taken over.
        """
        with self._lock, self._immediate.begin() as connection:
            self.fence(connection)
            workers = schema.node_workers
            now = database_now(connection)
            result = connection.execute(
                update(workers)
                .where(workers.c.worker_id == self.worker_id)
                .values(renewed_at=now, expires_at=now + round(self.lease_seconds * 1000))
            )
            if result.rowcount != 1:
                raise LeaseLostError(
                    f"worker {self.worker_id[:8]}'s lease row is gone: another process took "
                    "the node over; this one must exit"
                )
        self._next_renewal = time.monotonic() + self.lease_seconds / 3

    def renew_if_due(self) -> bool:
        """Renew if a third of the lease has passed since the last renewal; True if renewed."""
        if not self.epochs or time.monotonic() < self._next_renewal:
            return False
        self.renew()
        return True

    def holders(self) -> list[Holder]:
        """Every worker row of the node (for reports and tests)."""
        with self.engine.connect() as connection:
            return [_holder(row) for row in connection.execute(select(schema.node_workers))]

    def release(self) -> None:
        """Give the partitions up (a clean stop); harmless if they were lost or never held."""
        if not self.epochs:
            return
        partitions, workers = schema.node_partitions, schema.node_workers
        try:
            with self._lock, self._immediate.begin() as connection:
                connection.execute(
                    update(partitions)
                    .where(partitions.c.holder == self.worker_id)
                    .values(holder=None)
                )
                connection.execute(delete(workers).where(workers.c.worker_id == self.worker_id))
        finally:
            self.epochs = {}


def _fence_query(postgres: bool) -> Any:
    """The partitions a worker holds, with their epochs, in the lock order of a takeover.

    Built once (per dialect): the worker is a bound parameter, ``holder``.
    """
    partitions = schema.node_partitions
    query = (
        select(partitions.c.partition, partitions.c.epoch)
        .where(partitions.c.holder == bindparam("holder"))
        .order_by(partitions.c.partition)
    )
    return query.with_for_update(read=True) if postgres else query


_FENCE_QUERIES = {postgres: _fence_query(postgres) for postgres in (False, True)}
"""The fence's query on SQLite (False) and on PostgreSQL (True, rows locked FOR SHARE)."""


def _create_partitions(connection: Connection) -> None:
    """Make the partition rows if this database has none yet (concurrent callers are fine)."""
    partitions = schema.node_partitions
    existing = set(connection.execute(select(partitions.c.partition)).scalars())
    missing = [
        {"partition": p, "holder": None, "epoch": 0, "acquired_at": None}
        for p in range(PARTITIONS)
        if p not in existing
    ]
    if not missing:
        return
    module: Any = postgresql if connection.dialect.name == "postgresql" else sqlite
    connection.execute(
        module.insert(partitions).on_conflict_do_nothing(index_elements=["partition"]), missing
    )


def application_name(worker_id: str) -> str:
    """The PostgreSQL ``application_name`` of a worker's database sessions."""
    return f"fiberflow {worker_id}"


class LeaseKeeper:
    """Renews a lease on a thread of its own; calls ``on_lost`` once if the lease is lost.

    Errors other than losing the lease (the database is unreachable for a moment) are logged
    and retried at the next tick; the lease's own expiry decides whether it survives them.
    """

    def __init__(
        self, lease: NodeLease, on_lost: Callable[[LeaseLostError], None], name: str
    ) -> None:
        self._lease = lease
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{name}", daemon=True)

    def start(self) -> None:
        """Start renewing."""
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the lease itself is released by its owner)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        regular = self._lease.lease_seconds / 3
        interval = regular
        while not self._stop.wait(interval):
            interval = regular
            try:
                self._lease.renew()
            except LeaseLostError as error:
                self._on_lost(error)
                return
            except (DBAPIError, OSError) as error:
                interval = min(RETRY_RENEWAL_SECONDS, regular)  # try again soon
                log.warning("cannot renew the node lease yet: %s", error)
            except Exception:  # a bug here must not end renewal silently
                log.exception("renewing the node lease failed")


__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "PARTITIONS",
    "Holder",
    "LeaseError",
    "LeaseHeldError",
    "LeaseKeeper",
    "LeaseLostError",
    "NodeLease",
    "WorkerInfo",
    "application_name",
    "database_now",
    "partition_of",
    "process_is_gone",
]
