"""The node lease: which process may run which of a node's flows, fenced inside every commit.

A node's flows are divided into ``PARTITIONS`` partitions by flow id
(:mod:`statemachine.partitions`). What a node process (a *worker*) holds is a lease on
partitions: the right to run their flows. A node runs either as one process, which holds
every partition, or as several workers (``shared``, PostgreSQL only), each holding a fair
share; each partition is held by one worker at a time.

Tables (columns documented in docs/schema.md):

* ``node_workers``: one row per live worker: its id (a fresh random id per process start),
  its name (``--worker NAME``; empty for a node run as one process), whether it is one of
  several (``shared``), process id, host, boot id and process start time (to tell a dead
  process from a live one on the same host), when it started, and when its lease expires.
  Times are milliseconds of the *database's* clock, so workers on several hosts agree on them.
* ``node_partitions``: one row per partition: the worker holding it and its *epoch*, a
  number bumped every time the partition changes hands.

Rules:

* :meth:`NodeLease.acquire` of a node run as one process takes every partition in one
  transaction. Another worker is taken over only if its lease has expired, or it ran on this
  host and its process is gone (a SIGKILLed node restarts at once). Otherwise it raises
  :class:`LeaseHeldError`, naming the holder and since when. Taking a partition bumps its
  epoch and deletes the worker row of the previous holder.
* A worker of a shared node joins instead: it is refused beside a node run as one process,
  or beside a live worker of the same name; it takes the fair share
  (:func:`~statemachine.partitions.assign_partitions`) of what is free or held by dead
  workers. :meth:`NodeLease.rebalance`, every :data:`RENEWAL_SECONDS`, renews it and moves
  towards the fair share of the live workers: it takes free and dead partitions (each a
  compare-and-set on holder and epoch), and names the partitions it should hand over; the
  worker stops running their flows, then frees them with :meth:`NodeLease.release_partitions`,
  and their new holder takes them at its next rebalance. A live worker's partitions are only
  ever freed by that worker.
* :meth:`NodeLease.fence` is the first statement of every transaction that changes the
  node's flows: it checks, under a lock that a takeover must wait for, that every partition
  the worker holds still names it with the epoch it took. If not, the worker has been
  replaced (it was paused or cut off past its lease, and another process took over):
  :class:`LeaseLostError` rolls the transaction back, and the process must exit.
* :meth:`NodeLease.renew` extends the lease (a worker renews every second, or every third
  of the lease if that is shorter; a node process does it on a thread of its own, so
  long-running flow code cannot starve it). A renewal also stores the worker's flow counts.
  An expired lease nobody has taken over is renewed: its holder was never replaced.
* :meth:`NodeLease.release` frees the partitions at a clean stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection

import attrs
from sqlalchemy import (
    Connection,
    Engine,
    delete,
    select,
    text,
    update,
)
from sqlalchemy.exc import OperationalError

from foundation.engine import end_sessions
from persistence import schema
from persistence.lease_rows import (
    FENCE_QUERIES,
    Holder,
    create_partition_rows,
    database_now,
    insert_worker_row,
    is_dead,
    other_holders,
    read_assignment,
    read_holders,
)
from persistence.worker_process import (
    WorkerInfo,
)
from statemachine.limits import WORKER_NAME_CHARS
from statemachine.partitions import assign_partitions, partition_of

log = logging.getLogger("fiberflow.lease")

DEFAULT_LEASE_SECONDS = 20.0
"""How long a worker's lease lasts without renewal."""
RETRY_RENEWAL_SECONDS = 0.5
"""After a failed renewal (the database went away for a moment), the next try comes soon."""
TAKEOVER_LOCK_TIMEOUT_MS = 2000
"""PostgreSQL: how long a takeover waits for a row lock held by an expired holder's backend
before ending that backend (a process frozen in the middle of a transaction)."""
RENEWAL_SECONDS = 1.0
"""How often a worker renews its lease at most (a third of the lease if that is shorter). A
renewal also carries the worker's flow counts (for ``fiberflow flow list``), and for a worker
of a node run by several workers it is a rebalance: the delay of a hand-over after a join or
a leave."""
SQLITE_SINGLE_PROCESS = (
    "a node on SQLite runs as one process: several workers (--worker) need the node database "
    "on PostgreSQL"
)


class LeaseError(RuntimeError):
    """Something about the node lease prevents running the node."""


class LeaseHeldError(LeaseError):
    """Another live process holds the node's lease; this one must not start."""


class LeaseLostError(LeaseError):
    """The process no longer holds the node's lease: another took over. It must exit."""


class PartitionNotHeldError(LeaseError):
    """A worker was about to commit a flow of a partition it does not hold.

    A bug: nothing was committed, and the node is rebuilt on the partitions it holds.
    """


@attrs.frozen
class Rebalance:
    """What one rebalancing of a worker changed and asks for (see :meth:`NodeLease.rebalance`).

    ``taken``: partitions this worker took (free, or from a dead worker): it now runs their
    flows. ``to_release``: partitions the fair share gives to another live worker: this one
    stops running their flows, then hands them over with :meth:`NodeLease.release_partitions`.
    """

    taken: frozenset[int] = frozenset()
    to_release: frozenset[int] = frozenset()
    workers: int = 1
    """Live workers of the node seen, this one included."""


class NodeLease:
    """One worker's lease on a node database (see the module docstring).

    ``engine`` is the node database's engine (for PostgreSQL, already translated to the
    node's schema). Nothing is held until :meth:`acquire`. With ``shared`` the worker is one
    of several running the node (PostgreSQL only): it takes its fair share of the partitions
    and :meth:`rebalance` keeps the shares fair as workers join and leave.
    """

    def __init__(
        self,
        engine: Engine,
        worker: WorkerInfo | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        *,
        immediate: Engine | None = None,
        shared: bool = False,
    ) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be positive, not {lease_seconds!r}")
        self.engine = engine
        self._immediate = immediate or engine
        self.worker = worker or WorkerInfo.of_this_process()
        if len(self.worker.name) > WORKER_NAME_CHARS:
            raise ValueError(
                f"worker name {self.worker.name[:80]!r}... is longer than {WORKER_NAME_CHARS} "
                "characters"
            )
        self.lease_seconds = lease_seconds
        self.shared = shared
        self.epochs: dict[int, int] = {}
        """The partitions held, with the epoch each was taken at. Replaced whole, never
        changed in place, so a reader on another thread sees one consistent set."""
        self.taken_over_from: list[WorkerInfo] = []
        """Workers whose partitions the last :meth:`acquire` or :meth:`rebalance` that took
        any took (dead or expired): what they held in the transport is released at once."""
        self.flow_counts: str | None = None
        """What the worker last said of its flows (JSON), stored on its row at each renewal
        for ``fiberflow flow list``; set by the serving thread, read by the keeper's."""
        self._joined = False
        self._next_renewal = 0.0
        self._lock = threading.Lock()

    @property
    def worker_id(self) -> str:
        """The id of the worker holding (or meant to hold) the lease."""
        return self.worker.worker_id

    @property
    def held(self) -> bool:
        """True while the lease is held (acquired, not released nor lost).

        A worker of a shared node may hold it with no partition for a while (it just joined,
        or there are more workers than partitions).
        """
        return self._joined

    @property
    def renewal_interval(self) -> float:
        """Seconds between renewals: a third of the lease, at most :data:`RENEWAL_SECONDS`."""
        return min(self.lease_seconds / 3, RENEWAL_SECONDS)

    # --- acquiring ------------------------------------------------------------------------

    def acquire(self) -> None:
        """Start holding the lease: every partition, or with ``shared`` a fair share.

        Raises :class:`LeaseHeldError` if a live process stands in the way: any other worker
        for a node run as one process; a node run as one process, or a live worker of the same
        name, for a worker of a shared node. Raises :class:`LeaseError` for ``shared`` on a
        database that is not PostgreSQL.
        """
        if self.shared and self.engine.dialect.name != "postgresql":
            raise LeaseError(SQLITE_SINGLE_PROCESS)
        for attempt in range(1, 6):
            try:
                with self._immediate.begin() as connection:
                    if self.shared:
                        taken = self._join(connection)
                    else:
                        self._acquire(connection)
                if self.shared:
                    self.epochs = taken
                self._joined = True
                self._next_renewal = time.monotonic() + self.renewal_interval
                self._end_sessions_of(self.taken_over_from)
                return
            except OperationalError as error:
                if attempt == 5 or not self._end_frozen_holders(error):
                    raise

    def _begin_change(self, connection: Connection) -> int:
        """The database's clock now; on PostgreSQL a bounded wait for row locks."""
        now = int(connection.execute(select(database_now(connection))).scalar_one())
        if connection.dialect.name == "postgresql":
            connection.execute(text(f"SET LOCAL lock_timeout = {TAKEOVER_LOCK_TIMEOUT_MS}"))
        create_partition_rows(connection)
        return now

    def _acquire(self, connection: Connection) -> None:
        """Take every partition (a node run as one process)."""
        partitions, workers = schema.node_partitions, schema.node_workers
        now = self._begin_change(connection)
        query = select(partitions.c.partition, partitions.c.holder, partitions.c.epoch)
        if connection.dialect.name == "postgresql":
            query = query.with_for_update()
        rows = connection.execute(query.order_by(partitions.c.partition)).all()
        holder_ids = {row.holder for row in rows if row.holder is not None}
        taken: list[WorkerInfo] = []
        for holder in other_holders(connection, self.worker_id):
            if is_dead(holder, now):
                if holder.worker.worker_id in holder_ids:
                    taken.append(holder.worker)
                continue
            if holder.shared:
                raise LeaseHeldError(
                    f"the node is running as several workers (one is {holder.describe(now)}); "
                    "refusing to start it as one process beside them (start this process "
                    "with --worker NAME to join them)"
                )
            raise LeaseHeldError(
                f"the node is already running: {holder.describe(now)}; refusing to start "
                "(two processes on one node would run its flows twice)"
            )
        insert_worker_row(connection, self.worker, now, self.lease_seconds, self.shared)
        connection.execute(
            update(partitions).values(
                holder=self.worker_id, epoch=partitions.c.epoch + 1, acquired_at=now
            )
        )
        # Workers whose lease ran out or whose process is gone are forgotten.
        connection.execute(delete(workers).where(workers.c.worker_id != self.worker_id))
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

    def _join(self, connection: Connection) -> dict[int, int]:
        """Join the workers of a shared node and take a fair share; returns what was taken."""
        now = self._begin_change(connection)
        for holder in other_holders(connection, self.worker_id):
            if is_dead(holder, now):
                continue
            if not holder.shared:
                raise LeaseHeldError(
                    f"the node is running as one process: {holder.describe(now)}; stop it "
                    "before starting workers (a node runs either as one process or as workers)"
                )
            if holder.worker.name == self.worker.name:
                raise LeaseHeldError(
                    f"worker {self.worker.name!r} of the node is already running: "
                    f"{holder.describe(now)}; refusing to start a second one of that name"
                )
        insert_worker_row(connection, self.worker, now, self.lease_seconds, self.shared)
        taken, taken_from, _ = self._take_share(connection, now, {})
        self.taken_over_from = taken_from
        return taken

    def _take_share(
        self, connection: Connection, now: int, held: dict[int, int]
    ) -> tuple[dict[int, int], list[WorkerInfo], tuple[frozenset[int], int]]:
        """Take the partitions the fair share gives this worker that are free or dead.

        ``held`` is what this worker believes it holds. Returns the partitions taken (with
        their new epochs), the dead workers taken from, and the partitions to release with
        the number of live workers. Every take is a compare-and-set on the partition's holder
        and epoch: a partition another worker took meanwhile is left alone.
        """
        partitions, workers = schema.node_partitions, schema.node_workers
        rows = connection.execute(
            select(partitions.c.partition, partitions.c.holder, partitions.c.epoch)
        ).all()
        others = {
            holder.worker.worker_id: holder for holder in other_holders(connection, self.worker_id)
        }
        live = {w for w, holder in others.items() if not is_dead(holder, now)}
        live.add(self.worker_id)
        current = {row.partition: row.holder if row.holder in live else None for row in rows}
        target = assign_partitions(current, live)
        taken: dict[int, int] = {}
        taken_from: dict[str, WorkerInfo] = {}
        to_release: set[int] = set()
        for row in rows:
            mine = target.get(row.partition) == self.worker_id
            if row.holder == self.worker_id:
                if not mine:
                    to_release.add(row.partition)
                elif row.partition not in held:  # an earlier release of it did not commit
                    taken[row.partition] = row.epoch
                continue
            if not mine or row.holder in live:
                continue  # a live holder hands it over itself, at its own rebalance
            previous = (
                partitions.c.holder.is_(None)
                if row.holder is None
                else partitions.c.holder == row.holder
            )
            result = connection.execute(
                update(partitions)
                .where(
                    partitions.c.partition == row.partition,
                    partitions.c.epoch == row.epoch,
                    previous,
                )
                .values(holder=self.worker_id, epoch=row.epoch + 1, acquired_at=now)
            )
            if result.rowcount == 1:
                taken[row.partition] = row.epoch + 1
                if row.holder in others:
                    taken_from[row.holder] = others[row.holder].worker
        dead = [w for w in others if w not in live]
        if dead:
            holding = select(partitions.c.partition).where(
                partitions.c.holder == workers.c.worker_id
            )
            connection.execute(
                delete(workers).where(workers.c.worker_id.in_(dead), ~holding.exists())
            )
        for worker in taken_from.values():
            log.warning(
                "took partitions of the node over from %s, whose lease expired or whose "
                "process is gone",
                worker.describe(),
            )
        return taken, list(taken_from.values()), (frozenset(to_release), len(live))

    def _end_sessions_of(self, workers: list[WorkerInfo]) -> None:
        """PostgreSQL: end every database session left by workers taken over.

        That fences them out of the node database, and of a SQL queue on the same server,
        at once.
        """
        if not workers or self.engine.dialect.name != "postgresql":
            return
        with self.engine.connect() as connection:
            ended = end_sessions(connection, [worker.worker_id for worker in workers])
            connection.commit()
        if ended:
            log.warning("ended %d database session(s) of the workers taken over", ended)

    def _end_frozen_holders(self, error: OperationalError, *, refuse: bool = True) -> bool:
        """PostgreSQL: end the backends of expired holders that block a takeover.

        A holder frozen in the middle of a transaction (SIGSTOP, a paused VM) keeps its row
        locks; once its lease has expired its backends are ended so the takeover can proceed
        (when it thaws, its commits fail the fence). True if the error was such a wait.
        With ``refuse``, a live holder found meanwhile raises :class:`LeaseHeldError`;
        without, it is left alone.
        """
        orig = getattr(error, "orig", None)
        if getattr(orig, "sqlstate", None) != "55P03":  # lock_not_available
            return False
        with self.engine.connect() as connection:
            now = int(connection.execute(select(database_now(connection))).scalar_one())
            expired = []
            for holder in other_holders(connection, self.worker_id):
                if not is_dead(holder, now):
                    if refuse:
                        raise LeaseHeldError(
                            f"the node is already running: {holder.describe(now)}; refusing "
                            "to start (two processes on one node would run its flows twice)"
                        ) from error
                    continue
                expired.append(holder.worker.worker_id)
            ended = end_sessions(connection, expired)
            connection.commit()
        log.warning("ended %d database session(s) of expired lease holders", ended)
        return True

    # --- holding ----------------------------------------------------------------------------

    def fence(self, connection: Connection) -> None:
        """Check, inside a write transaction, that this worker still holds its partitions.

        On PostgreSQL the partition rows are locked (``FOR SHARE``): a takeover waits for this
        transaction to end. On SQLite the node's write transactions hold the write lock from
        their first statement (``BEGIN IMMEDIATE``). Raises :class:`LeaseLostError` if another
        worker took any partition over. (A partition taken by a rebalance on another thread
        may show up before :attr:`epochs` lists it: it is not checked until then.)
        """
        held = self.epochs
        if not self._joined:
            raise LeaseLostError(
                "this process holds no lease on the node (released or never taken)"
            )
        if not held:
            return  # a worker holding no partition writes no flow
        query = FENCE_QUERIES[connection.dialect.name == "postgresql"]
        found = {row[0]: row[1] for row in connection.execute(query, {"holder": self.worker_id})}
        lost = sorted(p for p, e in held.items() if found.get(p) != e)
        if lost:
            raise LeaseLostError(
                f"worker {self.worker_id[:8]} lost partitions {lost} of the node to another "
                "process (this one was paused or cut off past its lease); it must exit"
            )

    def check_writes(self, flow_ids: Collection[str]) -> None:
        """Raise :class:`PartitionNotHeldError` unless every flow's partition is held.

        Called before a commit with the flows the transaction writes. The fence at the
        transaction's start checked (and on PostgreSQL locked) the epochs of every partition
        held, so together they check the epochs of the partitions written.
        """
        if not self.shared:
            return  # a node run as one process holds every partition
        held = self.epochs
        strays = sorted({f for f in flow_ids if partition_of(f) not in held})
        if strays:
            raise PartitionNotHeldError(
                f"worker {self.worker.name!r} was about to commit flows of partitions it does "
                f"not hold ({', '.join(strays[:3])}{' ...' if len(strays) > 3 else ''}, "
                f"partitions {sorted({partition_of(f) for f in strays})}); nothing was committed"
            )

    def renew(self) -> None:
        """Extend the lease by ``lease_seconds`` from now (database clock).

        Raises :class:`LeaseLostError` if another worker has taken over.
        """
        with self._lock, self._immediate.begin() as connection:
            self.fence(connection)
            self._renew_row(connection)
        self._next_renewal = time.monotonic() + self.renewal_interval

    def _renew_row(self, connection: Connection) -> None:
        workers = schema.node_workers
        now = database_now(connection)
        result = connection.execute(
            update(workers)
            .where(workers.c.worker_id == self.worker_id)
            .values(
                renewed_at=now,
                expires_at=now + round(self.lease_seconds * 1000),
                flow_counts=self.flow_counts,
            )
        )
        if result.rowcount != 1:
            raise LeaseLostError(
                f"worker {self.worker_id[:8]}'s lease row is gone: another process took "
                "the node over; this one must exit"
            )

    def rebalance(self) -> Rebalance:
        """Renew the lease of a worker of a shared node and move towards the fair share.

        Takes (compare-and-set) the partitions the share gives this worker that are free or
        held by a dead worker, and names those the share gives to another live worker: the
        caller stops running their flows and hands them over with
        :meth:`release_partitions`. A row lock held by a frozen expired worker is waited for
        a bounded time; its backends are then ended and the take is tried at the next call.
        Raises :class:`LeaseLostError` if this worker lost a partition or its row.
        """
        if not self.shared:
            raise LeaseError("rebalance() is for the workers of a node run by several workers")
        with self._lock:
            try:
                with self._immediate.begin() as connection:
                    self.fence(connection)
                    self._renew_row(connection)
                    now = self._begin_change(connection)
                    taken, taken_from, (to_release, live) = self._take_share(
                        connection, now, self.epochs
                    )
            except OperationalError as error:
                if not self._end_frozen_holders(error, refuse=False):
                    raise
                return Rebalance(workers=0)
            if taken:
                self.epochs = {**self.epochs, **taken}
            if taken_from:
                self.taken_over_from = taken_from
            self._next_renewal = time.monotonic() + self.renewal_interval
        self._end_sessions_of(taken_from)
        return Rebalance(frozenset(taken), to_release, live)

    def release_partitions(self, released: set[int] | frozenset[int]) -> None:
        """Hand partitions over: this worker has stopped running their flows.

        They leave :attr:`epochs` first (the fence no longer expects them), then their rows
        are freed if they still name this worker at the epoch it held; another worker takes
        them at its next rebalance. If the release does not commit, the next
        :meth:`rebalance` names them again.
        """
        with self._lock:
            held = self.epochs
            giving = {p: e for p, e in held.items() if p in released}
            if not giving:
                return
            self.epochs = {p: e for p, e in held.items() if p not in released}
            partitions = schema.node_partitions
            with self._immediate.begin() as connection:
                for partition, epoch in sorted(giving.items()):
                    connection.execute(
                        update(partitions)
                        .where(
                            partitions.c.partition == partition,
                            partitions.c.holder == self.worker_id,
                            partitions.c.epoch == epoch,
                        )
                        .values(holder=None)
                    )
        log.info("handed partitions %s of the node over", sorted(giving))

    def renew_if_due(self) -> bool:
        """Renew if the renewal interval has passed since the last renewal; True if renewed."""
        if not self._joined or self.shared or time.monotonic() < self._next_renewal:
            return False
        self.renew()
        return True

    def holders(self) -> list[Holder]:
        """Every worker row of the node (for reports and tests)."""
        return read_holders(self.engine)

    def assignment(self) -> dict[int, str | None]:
        """Which worker id holds each partition now (None: free), as the table says."""
        return read_assignment(self.engine)

    def release(self) -> None:
        """Give everything up (a clean stop); harmless if it was lost or never held."""
        if not self._joined:
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
            self._joined = False


__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "RENEWAL_SECONDS",
    "SQLITE_SINGLE_PROCESS",
    "LeaseError",
    "LeaseHeldError",
    "LeaseLostError",
    "PartitionNotHeldError",
    "NodeLease",
    "Rebalance",
]
