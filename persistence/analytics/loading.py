"""Reading node databases into Spark, from a consistent snapshot of each database.

Two paths, and the report says which one each node took:

* **JDBC** (the default when a driver jar is found, see ``find_jdbc_jars``): Spark reads the
  tables itself, split into up to ``max_partitions`` key ranges per table (the keys are hex
  flow ids, and message ids ``N-<flow id>...``, so ranges of the first hex digit are even).
  Every column gets an explicit type (``customSchema``): the SQLite driver would otherwise
  read ``INTEGER`` as 32 bits and silently wrap millisecond timestamps.
* **Arrow** (no jar, or ``path="arrow"``): the tables are streamed through SQLAlchemy into
  Arrow record batches with 64-bit integer columns, written as Parquet in the staging folder,
  and Spark reads the Parquet.

Separate reads of live tables are not one snapshot, so both paths read from one:

* SQLite: the database is first copied with SQLite's online backup (one read transaction,
  so the copy is a consistent snapshot of the file), and only the copy is read.
* PostgreSQL: one ``REPEATABLE READ`` transaction per database is opened and held while the
  tables are read; Spark's JDBC connections join it with ``SET TRANSACTION SNAPSHOT`` (an
  exported snapshot), so every node schema in that database is read as of one instant.

Nodes in separate databases are snapshotted one after the other; the report gives each
snapshot's time. On a cluster, ``staging_dir`` must be a folder every executor can read (the
SQLite copies and the Parquet files are written there).
"""

from __future__ import annotations

import itertools
import math
import re
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import attrs
from sqlalchemy import Connection, create_engine, inspect, text

from persistence.analytics.sources import (
    JDBC_DRIVER_CLASSES,
    JdbcJars,
    NodeSource,
    check_unique_names,
    find_jdbc_jars,
    jdbc_url,
)
from persistence.engine import normalize_url

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame, SparkSession

ReadPath = Literal["auto", "jdbc", "arrow"]

STRING = "string"
LONG = "long"

TABLES: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "checkpoints": (
        "node_checkpoints",
        "flow_id",
        (
            ("flow_id", STRING),
            ("flow_class", STRING),
            ("status", STRING),
            ("progress_step", STRING),
            ("suspended_on", STRING),
            ("waiting_for", STRING),
            ("journal_length", LONG),
            ("checkpoint_bytes", LONG),
            ("error_message", STRING),
            ("created_at", LONG),
            ("updated_at", LONG),
        ),
    ),
    "results": (
        "node_flow_results",
        "flow_id",
        (("flow_id", STRING), ("flow_class", STRING), ("completed_at", LONG)),
    ),
    "exceptions": (
        "node_flow_exceptions",
        "flow_id",
        (
            ("flow_id", STRING),
            ("flow_class", STRING),
            ("error_kind", STRING),
            ("exception_class", STRING),
            ("message", STRING),
            ("failed_at", LONG),
        ),
    ),
    "message_ids": (
        "node_message_ids",
        "message_id",
        (
            ("message_id", STRING),
            ("sender", STRING),
            ("session_id", STRING),
            ("sequence", LONG),
            ("inserted_at", LONG),
        ),
    ),
    "outbox": (
        "node_outbox",
        "message_id",
        (("message_id", STRING), ("target", STRING), ("created_at", LONG)),
    ),
    "paused": ("node_paused_flows", "flow_id", (("flow_id", STRING), ("paused_at", LONG))),
}
"""Frame name: (node table, partition key, columns read with their types). Blobs and
payloads are never read."""

ROWS_PER_PARTITION = 250_000
"""Rows a JDBC partition reads (at most ``max_partitions`` partitions per table)."""

HEX_DIGITS = "0123456789abcdef"


class AnalyticsLoadError(RuntimeError):
    """A node database could not be read (missing tables, no driver, a moving snapshot)."""


@attrs.frozen
class NodeLoad:
    """How one node's tables were read."""

    name: str
    url: str
    """The database URL, password hidden."""
    path: str
    """``"jdbc"`` or ``"arrow"``."""
    detail: str
    """The driver or the reason for the fallback, and the partitions."""
    snapshot: str
    """How the consistent snapshot was taken."""
    taken_at_ms: int
    """Wall-clock time of the snapshot (ms since the epoch)."""
    rows: dict[str, int]
    """Rows per frame name (``checkpoints``, ``message_ids``, ...)."""
    named_by: str = "argument"
    """Where the node's name came from: ``argument`` (``NAME=URL``), ``other nodes`` (found
    in the other nodes' tables) or ``unknown`` (the URL stands in for it)."""


@attrs.define
class Snapshot:
    """The node tables of every analyzed node, as Spark DataFrames with a ``node`` column.

    Use it as a context manager: on exit the cached data, the held PostgreSQL transactions
    and the staging files are released.
    """

    spark: SparkSession
    nodes: list[NodeLoad]
    frames: dict[str, DataFrame]
    _cleanup: list[Callable[[], None]] = attrs.field(factory=list, alias="cleanup")

    @property
    def node_names(self) -> list[str]:
        """The analyzed nodes, in the order given."""
        return [node.name for node in self.nodes]

    @property
    def taken_at_ms(self) -> int:
        """The earliest snapshot time: the default "now" of the time-based checks."""
        return min(node.taken_at_ms for node in self.nodes)

    @property
    def spread_ms(self) -> int:
        """Time between the first and the last snapshot (0 when taken in one transaction)."""
        return max(n.taken_at_ms for n in self.nodes) - min(n.taken_at_ms for n in self.nodes)

    @property
    def checkpoints(self) -> DataFrame:
        """``node_checkpoints`` of every node, with ``node``."""
        return self.frames["checkpoints"]

    @property
    def results(self) -> DataFrame:
        """``node_flow_results`` (no result blobs), with ``node``."""
        return self.frames["results"]

    @property
    def exceptions(self) -> DataFrame:
        """``node_flow_exceptions``, with ``node``."""
        return self.frames["exceptions"]

    @property
    def message_ids(self) -> DataFrame:
        """``node_message_ids`` (the dedup ids of consumed messages), with ``node``."""
        return self.frames["message_ids"]

    @property
    def outbox(self) -> DataFrame:
        """``node_outbox`` (no payloads), with ``node``."""
        return self.frames["outbox"]

    @property
    def paused(self) -> DataFrame:
        """``node_paused_flows`` (flows an operator paused), with ``node``."""
        return self.frames["paused"]

    def on_close(self, release: Callable[[], object]) -> None:
        """Have ``release`` called when the snapshot closes (cached check results)."""

        def run() -> None:
            release()

        self._cleanup.append(run)

    def close(self) -> None:
        """Release the cache, the held transactions and the staging files."""
        for frame in self.frames.values():
            frame.unpersist()
        while self._cleanup:
            self._cleanup.pop()()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@attrs.define
class _Opened:
    """A database opened at a snapshot: how to count and read its node tables."""

    sources: list[NodeSource]
    connection: Connection
    description: str
    taken_at_ms: int
    jdbc_file: Path | None = None
    jdbc_init: str | None = None


def probe_source(source: NodeSource, timeout_s: int = 5) -> None:
    """Fail fast, before Spark starts: the database opens and holds a node's tables.

    Raises :class:`AnalyticsLoadError` naming the node, the URL (password hidden) and what
    is wrong (no such file, not a SQLite file, cannot connect, no fiberflow tables).
    """
    wanted = {table for table, _, _ in TABLES.values()}
    where = f"{source.name}: {source.display_url()}" if source.named else source.display_url()
    if source.dialect == "sqlite":
        path = source.sqlite_path
        if not path.is_file():
            raise AnalyticsLoadError(f"{where}: no database file {path}")
        try:
            connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                found = {
                    row[0]
                    for row in connection.execute(
                        "SELECT name FROM sqlite_master WHERE type='table'"
                    )
                }
            finally:
                connection.close()
        except sqlite3.Error as error:
            raise AnalyticsLoadError(f"{where}: cannot read {path}: {error}") from error
    else:
        engine = create_engine(
            normalize_url(source.url), connect_args={"connect_timeout": timeout_s}
        )
        try:
            with engine.connect() as probe:
                found = set(inspect(probe).get_table_names(schema=source.schema))
        except Exception as error:
            reason = getattr(error, "orig", None) or error
            raise AnalyticsLoadError(f"{where}: cannot connect: {reason}") from error
        finally:
            engine.dispose()
    missing = sorted(wanted - found)
    if missing:
        place = f" (schema {source.schema})" if source.schema else ""
        raise AnalyticsLoadError(
            f"{where}{place} is not a fiberflow node database: no table {', '.join(missing)}"
        )


def _qualified(source: NodeSource, table: str) -> str:
    if source.schema is None:
        return table
    return f'"{source.schema}"."{table}"'


def _check_identifier(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", value):
        raise AnalyticsLoadError(f"schema name {value!r} is not a plain identifier")
    return value


def _open_sqlite(source: NodeSource, staging: Path, index: int) -> _Opened:
    path = source.sqlite_path
    if not path.exists():
        raise AnalyticsLoadError(f"{source.name}: no database file {path}")
    copy = staging / f"node{index}-snapshot.db"
    live = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    target = sqlite3.connect(copy)
    try:
        live.execute("PRAGMA busy_timeout=10000")
        live.backup(target)  # one step: a single read transaction, a consistent copy
        taken_at = time.time()
    finally:
        target.close()
        live.close()
    engine = create_engine(f"sqlite:///{copy}")
    connection = engine.connect()
    when = _iso(taken_at)
    return _Opened(
        sources=[source],
        connection=connection,
        description=f"SQLite online backup of {path} at {when}",
        taken_at_ms=round(taken_at * 1000),
        jdbc_file=copy,
    )


def _open_postgresql(sources: list[NodeSource]) -> _Opened:
    engine = create_engine(normalize_url(sources[0].url))
    connection = engine.connect().execution_options(isolation_level="REPEATABLE READ")
    try:
        connection.begin()
        connection.execute(text("SET TRANSACTION READ ONLY"))
        snapshot_id = connection.execute(text("SELECT pg_export_snapshot()")).scalar_one()
        taken_at = time.time()
        if not re.fullmatch(r"[0-9A-Fa-f-]+", snapshot_id):
            raise AnalyticsLoadError(f"unexpected snapshot id {snapshot_id!r}")
    except BaseException:
        connection.close()
        engine.dispose()
        raise
    init = (
        f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'"
    )
    names = ", ".join(source.name for source in sources)
    return _Opened(
        sources=sources,
        connection=connection,
        description=(
            f"one PostgreSQL REPEATABLE READ transaction (exported snapshot {snapshot_id}) "
            f"for {names}, at {_iso(taken_at)}"
        ),
        taken_at_ms=round(taken_at * 1000),
        jdbc_init=init,
    )


def _iso(seconds: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        + f".{int(seconds % 1 * 1000):03d}Z"
    )


def _boundaries(partitions: int) -> list[str]:
    step = len(HEX_DIGITS) / partitions
    return [HEX_DIGITS[math.floor(i * step)] for i in range(1, partitions)]


def range_predicates(key: str, prefix: str, partitions: int, dialect: str) -> list[str]:
    """SQL conditions that split a table into ``partitions`` ranges of ``key``.

    Every row falls in exactly one range, whatever its key looks like (the ranges cover the
    whole string order, compared byte by byte: ``COLLATE "C"`` on PostgreSQL).
    """
    column = f'{key} COLLATE "C"' if dialect == "postgresql" else key
    points = [f"'{prefix}{digit}'" for digit in _boundaries(partitions)]
    if not points:
        return ["1=1"]
    predicates = [f"{column} < {points[0]}"]
    predicates += [
        f"{column} >= {low} AND {column} < {high}" for low, high in itertools.pairwise(points)
    ]
    predicates.append(f"{column} >= {points[-1]}")
    return predicates


def plan_partitions(
    rows: int, max_partitions: int, rows_per_partition: int = ROWS_PER_PARTITION
) -> int:
    """How many JDBC partitions to read ``rows`` rows with."""
    wanted = math.ceil(rows / rows_per_partition) if rows else 1
    return max(1, min(wanted, max_partitions, len(HEX_DIGITS)))


def _spark_schema(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {'BIGINT' if kind == LONG else 'STRING'}" for name, kind in columns)


def _arrow_schema(columns: Sequence[tuple[str, str]]) -> pyarrow.Schema:
    import pyarrow as pa

    return pa.schema(
        [(name, pa.int64() if kind == LONG else pa.string()) for name, kind in columns]
    )


def _count(opened: _Opened, source: NodeSource, table: str) -> int:
    try:
        query = text(f"SELECT count(*) FROM {_qualified(source, table)}")
        return int(opened.connection.execute(query).scalar_one())
    except Exception as error:
        raise AnalyticsLoadError(
            f"{source.name}: cannot read {table} from {source.display_url()} "
            f"(is it a fiberflow node database?): {error}"
        ) from error


def _read_jdbc(
    spark: SparkSession,
    opened: _Opened,
    source: NodeSource,
    frame: str,
    jar: Path,
    partitions: int,
) -> DataFrame:
    table, key, columns = TABLES[frame]
    url, properties = jdbc_url(source, opened.jdbc_file)
    properties = dict(properties, driver=JDBC_DRIVER_CLASSES[source.dialect])
    properties["customSchema"] = _spark_schema(columns)
    if source.dialect == "postgresql":
        properties["fetchsize"] = "10000"
        assert opened.jdbc_init is not None
        properties["sessionInitStatement"] = opened.jdbc_init
    selected = ", ".join(name for name, _ in columns)
    query = f"(SELECT {selected} FROM {_qualified(source, table)}) AS snapshot_rows"
    prefix = "N-" if key == "message_id" else ""
    predicates = range_predicates(key, prefix, partitions, source.dialect)
    return spark.read.jdbc(url, query, predicates=predicates, properties=properties)


def _read_arrow(
    spark: SparkSession, opened: _Opened, source: NodeSource, frame: str, folder: Path
) -> DataFrame:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table, _, columns = TABLES[frame]
    schema = _arrow_schema(columns)
    selected = ", ".join(name for name, _ in columns)
    query = text(f"SELECT {selected} FROM {_qualified(source, table)}")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{frame}.parquet"
    result = opened.connection.execution_options(stream_results=True, yield_per=50_000).execute(
        query
    )
    with pq.ParquetWriter(target, schema) as writer:
        wrote = False
        for chunk in result.partitions():
            values = list(zip(*chunk, strict=True))
            arrays = [pa.array(values[i], type=schema.field(i).type) for i in range(len(columns))]
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
            wrote = True
        if not wrote:
            writer.write_table(schema.empty_table())
    return spark.read.parquet(str(target))


def _jar_on_classpath(spark: SparkSession, jar: Path) -> bool:
    configured = spark.sparkContext.getConf().get("spark.jars", "") or ""
    names = {Path(item.removeprefix("file:")).name for item in configured.split(",") if item}
    return jar.name in names or str(jar) in configured


def _choose_path(
    spark: SparkSession, dialect: str, jars: JdbcJars, path: ReadPath, search: str
) -> tuple[str, str, Path | None]:
    jar = jars.for_dialect(dialect)
    if path == "arrow":
        return "arrow", "SQLAlchemy → Arrow → Parquet (asked for)", None
    problem = None
    if jar is None:
        problem = f"no {dialect} JDBC jar in {search}"
    elif not _jar_on_classpath(spark, jar):
        problem = f"the Spark session was started without {jar.name} on its class path"
    if problem is None:
        assert jar is not None
        return "jdbc", f"JDBC ({jar.name})", jar
    if path == "jdbc":
        raise AnalyticsLoadError(f"cannot read {dialect} over JDBC: {problem}")
    return "arrow", f"SQLAlchemy → Arrow → Parquet (fallback: {problem})", None


def _group(sources: Sequence[NodeSource]) -> list[list[NodeSource]]:
    groups: dict[str, list[NodeSource]] = {}
    for index, source in enumerate(sources):
        key = source.url if source.dialect == "postgresql" else f"sqlite#{index}"
        groups.setdefault(key, []).append(source)
    return list(groups.values())


def load_nodes(
    spark: SparkSession,
    sources: Sequence[NodeSource],
    *,
    jar_search: Sequence[str | Path] | None = None,
    path: ReadPath = "auto",
    staging_dir: str | Path | None = None,
    max_partitions: int = 16,
    rows_per_partition: int = ROWS_PER_PARTITION,
    on_snapshot: Callable[[], None] | None = None,
) -> Snapshot:
    """Read the node tables of ``sources`` into a :class:`Snapshot` (cached in Spark).

    ``jar_search`` says where to look for the JDBC jars (default: ``$FIBERFLOW_JDBC_JARS``,
    else /usr/share/java); ``path`` forces ``"jdbc"`` or ``"arrow"``. A JDBC read takes one
    partition per ``rows_per_partition`` rows, at most ``max_partitions``. ``on_snapshot`` is
    called once every database's snapshot is taken and before any table is read (tests use
    it to change the live databases and show that the reads do not see it).
    """
    if not sources:
        raise AnalyticsLoadError("no node database to analyze")
    check_unique_names(sources)
    for source in sources:
        if source.schema is not None:
            _check_identifier(source.schema)
    jars = find_jdbc_jars(jar_search)
    search = ", ".join(str(p) for p in (jar_search or ["$FIBERFLOW_JDBC_JARS or /usr/share/java"]))
    owns_staging = staging_dir is None
    staging = Path(staging_dir or tempfile.mkdtemp(prefix="fiberflow-analytics-"))
    staging.mkdir(parents=True, exist_ok=True)
    cleanup: list[Callable[[], None]] = []
    if owns_staging:
        cleanup.append(lambda: shutil.rmtree(staging, ignore_errors=True))
    opened_all: list[_Opened] = []
    try:
        order = {source.name: i for i, source in enumerate(sources)}
        for group in _group(sources):
            if group[0].dialect == "sqlite":
                opened = _open_sqlite(group[0], staging, order[group[0].name])
            else:
                opened = _open_postgresql(group)
            opened_all.append(opened)
            cleanup.append(_closer(opened.connection))
        if on_snapshot is not None:
            on_snapshot()
        loads: dict[str, NodeLoad] = {}
        parts: dict[str, list[DataFrame]] = {frame: [] for frame in TABLES}
        for opened in opened_all:
            for source in opened.sources:
                load, frames = _load_source(
                    spark,
                    opened,
                    source,
                    (jars, path, search),
                    staging,
                    (max_partitions, rows_per_partition),
                    order,
                )
                loads[source.name] = load
                for frame, data in frames.items():
                    parts[frame].append(data)
        frames = _union_and_cache(spark, parts)
        _verify_counts(frames, loads)
        if not all(source.named for source in sources):
            cleanup.append(_unpersister(list(frames.values())))
            frames, loads = _apply_names(frames, loads, infer_node_names(frames, sources))
        nodes = [loads[source.name] for source in sources]
        return Snapshot(spark=spark, nodes=nodes, frames=frames, cleanup=cleanup)
    except BaseException:
        while cleanup:
            cleanup.pop()()
        raise


def infer_node_names(
    frames: dict[str, DataFrame], sources: Sequence[NodeSource]
) -> dict[str, str | None]:
    """The node name of each database given as a plain URL, found in the others' tables.

    Another node's tables name their counterparty with each session end they show (a
    consumed message's ``sender``, an outbox row's ``target``, a waited-on session's
    ``counterparty``). The other end of that session (``X`` <-> ``X.r``) belongs to the
    database that shows it too (consumed, queued or waited on there), or, for an initiator
    end ``F.sN``, whose flows include ``F``. Every such pair names the database; a database
    named two ways is an error (the same database given twice?), one named by nobody keeps
    its URL as the name (None here): its sessions cannot then be matched across nodes.

    ``frames`` are the loaded frames with the stand-in names (the URLs) in ``node``.
    """
    from pyspark.sql import functions as F

    from persistence.analytics.checks import peer_session, session_flow, waits

    outbox_session = F.regexp_extract("message_id", r"^N-(.+)-[0-9]+$", 1)
    ends = (
        frames["message_ids"]
        .select("node", "session_id", F.col("sender").alias("counterparty"))
        .unionByName(
            frames["outbox"].select(
                "node", outbox_session.alias("session_id"), F.col("target").alias("counterparty")
            )
        )
        .unionByName(waits(frames["checkpoints"]).select("node", "session_id", "counterparty"))
        .where(F.col("session_id") != "")
        .distinct()
    )
    flows = (
        frames["checkpoints"]
        .select("node", "flow_id")
        .unionByName(frames["results"].select("node", "flow_id"))
        .unionByName(frames["exceptions"].select("node", "flow_id"))
        .distinct()
    )
    theirs = ends.select(
        F.col("node").alias("seen_on"),
        F.col("counterparty").alias("name"),
        peer_session(F.col("session_id")).alias("end"),
    )
    own_ends = ends.select(F.col("node").alias("database"), F.col("session_id").alias("end"))
    by_end = theirs.join(own_ends, "end")
    own_flows = flows.select(F.col("node").alias("database"), F.col("flow_id").alias("flow"))
    by_flow = theirs.where(~F.col("end").endswith(".r")).join(
        own_flows, session_flow(theirs["end"]) == own_flows["flow"]
    )
    pairs = (
        by_end.select("seen_on", "name", "database")
        .unionByName(by_flow.select("seen_on", "name", "database"))
        .where(F.col("seen_on") != F.col("database"))
        .select("database", "name")
        .distinct()
    )
    stand_ins = [source.name for source in sources if not source.named]
    found: dict[str, set[str]] = {}
    for row in pairs.where(F.col("database").isin(*stand_ins)).collect():
        found.setdefault(row["database"], set()).add(row["name"])
    given = {source.name for source in sources if source.named}
    names: dict[str, str | None] = {}
    for stand_in in stand_ins:
        candidates = sorted(found.get(stand_in, ()))
        if len(candidates) > 1:
            raise AnalyticsLoadError(
                f"{stand_in}: the other nodes' tables name it {' and '.join(candidates)}; "
                "give it as NAME=URL"
            )
        name = candidates[0] if candidates else None
        if name is not None and (name in given or name in names.values()):
            raise AnalyticsLoadError(f"{stand_in} is node {name}, which is given twice")
        names[stand_in] = name
    return names


def _unpersister(frames: list[DataFrame]) -> Callable[[], None]:
    def release() -> None:
        for frame in frames:
            frame.unpersist()

    return release


def _apply_names(
    frames: dict[str, DataFrame], loads: dict[str, NodeLoad], names: dict[str, str | None]
) -> tuple[dict[str, DataFrame], dict[str, NodeLoad]]:
    """Put the found names in place of the stand-ins (in ``node`` and in the loads)."""
    from pyspark.sql import functions as F

    renamed: dict[str, NodeLoad] = {}
    for key, load in loads.items():
        if key not in names:
            renamed[key] = load
            continue
        name = names[key]
        if name is None:
            renamed[key] = attrs.evolve(load, named_by="unknown")
        else:
            renamed[key] = attrs.evolve(load, name=name, named_by="other nodes")
    mapping = {key: name for key, name in names.items() if name is not None}
    if not mapping:
        return frames, renamed
    node = F.col("node")
    column = node
    for stand_in, name in mapping.items():
        column = F.when(node == stand_in, F.lit(name)).otherwise(column)
    return {key: frame.withColumn("node", column) for key, frame in frames.items()}, renamed


def _closer(connection: Connection) -> Callable[[], None]:
    def close() -> None:
        try:
            connection.rollback()
        finally:
            connection.close()
            connection.engine.dispose()

    return close


def _load_source(
    spark: SparkSession,
    opened: _Opened,
    source: NodeSource,
    reading: tuple[JdbcJars, ReadPath, str],
    staging: Path,
    partitioning: tuple[int, int],
    order: dict[str, int],
) -> tuple[NodeLoad, dict[str, DataFrame]]:
    from pyspark.sql import functions as F

    jars, path, search = reading
    max_partitions, rows_per_partition = partitioning

    chosen, detail, jar = _choose_path(spark, source.dialect, jars, path, search)
    rows = {frame: _count(opened, source, TABLES[frame][0]) for frame in TABLES}
    frames: dict[str, DataFrame] = {}
    most = 1
    for frame, (_, _, columns) in TABLES.items():
        if jar is not None:
            partitions = plan_partitions(rows[frame], max_partitions, rows_per_partition)
            most = max(most, partitions)
            data = _read_jdbc(spark, opened, source, frame, jar, partitions)
        else:
            folder = staging / f"node{order[source.name]}-parquet"
            data = _read_arrow(spark, opened, source, frame, folder)
        typed = [
            F.col(name).cast("bigint" if kind == LONG else "string").alias(name)
            for name, kind in columns
        ]
        frames[frame] = data.select(F.lit(source.name).alias("node"), *typed)
    if jar is not None:
        detail += f", up to {most} partition{'s' if most > 1 else ''} per table"
    load = NodeLoad(
        name=source.name,
        url=source.display_url(),
        path=chosen,
        detail=detail,
        snapshot=opened.description,
        taken_at_ms=opened.taken_at_ms,
        rows=rows,
    )
    return load, frames


def _union_and_cache(
    spark: SparkSession, parts: dict[str, list[DataFrame]]
) -> dict[str, DataFrame]:
    from pyspark import StorageLevel

    frames: dict[str, DataFrame] = {}
    for frame, datas in parts.items():
        combined = datas[0]
        for data in datas[1:]:
            combined = combined.unionByName(data)
        frames[frame] = combined.persist(StorageLevel.MEMORY_AND_DISK)
    return frames


def _verify_counts(frames: dict[str, DataFrame], loads: dict[str, NodeLoad]) -> None:
    """Materialize the cache, and check Spark read exactly the rows the snapshot has."""
    from pyspark.sql import functions as F

    for frame, data in frames.items():
        counted = {
            row["node"]: row["rows"]
            for row in data.groupBy("node").agg(F.count("*").alias("rows")).collect()
        }
        for name, load in loads.items():
            if counted.get(name, 0) != load.rows[frame]:
                raise AnalyticsLoadError(
                    f"{name}: Spark read {counted.get(name, 0)} rows of {TABLES[frame][0]} "
                    f"but the snapshot has {load.rows[frame]}: the snapshot moved while it "
                    "was read"
                )
