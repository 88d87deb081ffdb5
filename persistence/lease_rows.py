"""The lease's rows: holders, the partition assignment, the database's clock.

``node_workers`` holds one row per live worker (a :class:`Holder`) and ``node_partitions``
one row per partition (its holder and epoch); :mod:`persistence.lease` holds the rules that
change them. Everything here reads, except :func:`create_partition_rows`, which makes the
partition rows a new node database needs, and :func:`insert_worker_row`.
"""

from __future__ import annotations

import datetime
from typing import Any

import attrs
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Integer,
    bindparam,
    cast,
    extract,
    func,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite

from persistence import schema
from persistence.worker_process import WorkerInfo, process_is_gone
from statemachine.partitions import PARTITIONS


def database_now(connection: Connection) -> Any:
    """A SQL expression for the database's clock in integer milliseconds since the epoch."""
    if connection.dialect.name == "postgresql":
        return cast(func.floor(extract("epoch", func.clock_timestamp()) * 1000), BigInteger)
    return cast((func.julianday("now") - 2440587.5) * 86400000.0, Integer)


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
    shared: bool = False
    """True for a worker of a node run by several workers (``--worker``)."""
    flow_counts: str | None = None
    """What the worker last said of its flows (JSON), as of its last renewal."""

    def describe(self, now: int) -> str:
        """Who holds the lease, since when, and for how much longer."""
        return (
            f"{self.worker.describe()} since {_utc(self.started_at)}, lease renewed "
            f"{(now - self.renewed_at) / 1000:.1f} s ago, expiring in "
            f"{(self.expires_at - now) / 1000:.1f} s"
        )


def holder_of_row(row: Any) -> Holder:
    """A ``node_workers`` row as a :class:`Holder`."""
    worker = WorkerInfo(
        row.worker_id,
        row.pid,
        row.host,
        row.boot_id,
        row.process_start,
        row.pid_namespace,
        row.name,
    )
    return Holder(
        worker, row.started_at, row.renewed_at, row.expires_at, bool(row.shared), row.flow_counts
    )


def is_dead(holder: Holder, now: int) -> bool:
    """True if ``holder``'s lease ran out or its process (on this host) is gone."""
    return holder.expires_at <= now or process_is_gone(holder.worker)


def read_holders(engine: Engine) -> list[Holder]:
    """Every worker row of the node database behind ``engine``, oldest first."""
    workers = schema.node_workers
    with engine.connect() as connection:
        rows = connection.execute(select(workers).order_by(workers.c.started_at)).all()
    return [holder_of_row(row) for row in rows]


def live_holders(connection: Connection) -> tuple[int, list[Holder]]:
    """The database's clock (ms) and the workers whose lease runs and whose process lives.

    A row whose lease expired, or whose process on this host is gone (a SIGKILLed node),
    is not a live holder.
    """
    now = int(connection.execute(select(database_now(connection))).scalar_one())
    workers = schema.node_workers
    rows = connection.execute(select(workers).order_by(workers.c.started_at)).all()
    return now, [h for h in map(holder_of_row, rows) if not is_dead(h, now)]


def read_assignment(engine: Engine) -> dict[int, str | None]:
    """Which worker id holds each partition of the node behind ``engine`` (None: free)."""
    partitions = schema.node_partitions
    with engine.connect() as connection:
        return {
            row.partition: row.holder
            for row in connection.execute(select(partitions.c.partition, partitions.c.holder))
        }


def database_clock(engine: Engine) -> int:
    """The database's clock now, in milliseconds (what lease times are in)."""
    with engine.connect() as connection:
        return int(connection.execute(select(database_now(connection))).scalar_one())


def fence_query(postgres: bool) -> Any:
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


FENCE_QUERIES = {postgres: fence_query(postgres) for postgres in (False, True)}
"""The fence's query on SQLite (False) and on PostgreSQL (True, rows locked FOR SHARE)."""


def create_partition_rows(connection: Connection) -> None:
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


def other_holders(connection: Connection, worker_id: str) -> list[Holder]:
    """Every worker row of the node but ``worker_id``'s, in worker id order (the lock order)."""
    workers = schema.node_workers
    return [
        holder_of_row(row)
        for row in connection.execute(
            select(workers).where(workers.c.worker_id != worker_id).order_by(workers.c.worker_id)
        )
    ]


def insert_worker_row(
    connection: Connection, worker: WorkerInfo, now: int, lease_seconds: float, shared: bool
) -> None:
    """Add ``worker``'s row, its lease running ``lease_seconds`` from ``now`` (database ms)."""
    connection.execute(
        insert(schema.node_workers).values(
            worker_id=worker.worker_id,
            pid=worker.pid,
            host=worker.host,
            boot_id=worker.boot_id,
            process_start=worker.process_start,
            pid_namespace=worker.pid_namespace,
            started_at=now,
            renewed_at=now,
            expires_at=now + round(lease_seconds * 1000),
            name=worker.name,
            shared=shared,
        )
    )
