"""Loading node databases into a :class:`~persistence.analytics.snapshot.Snapshot`.

:func:`load_nodes` is the whole way in, one step per module:

1. open every database at a consistent snapshot (:mod:`persistence.analytics.opening`:
   a SQLite backup copy, or one held PostgreSQL transaction for every node schema in that
   database);
2. read each node's tables into Spark (:mod:`persistence.analytics.reading`: JDBC, or
   Arrow and Parquet without a driver jar), with a ``node`` column;
3. union the nodes' rows per table, cache them, and check Spark read exactly the rows the
   snapshot has;
4. name the databases given as plain URLs (:mod:`persistence.analytics.naming`).

Nodes in separate databases are snapshotted one after the other; the report gives each
snapshot's time. On a cluster, ``staging_dir`` must be a folder every executor can read (the
SQLite copies and the Parquet files are written there).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from persistence.analytics.flow_facts import FACT_FRAMES, with_facts
from persistence.analytics.naming import apply_names, infer_node_names
from persistence.analytics.opening import (
    OpenedDatabase,
    check_identifier,
    closer,
    count_rows,
    open_postgresql,
    open_sqlite,
)
from persistence.analytics.reading import (
    ROWS_PER_PARTITION,
    ReadPath,
    choose_path,
    plan_partitions,
    read_arrow,
    read_jdbc,
)
from persistence.analytics.snapshot import NodeLoad, Snapshot
from persistence.analytics.sources import (
    JdbcJars,
    NodeSource,
    check_unique_names,
    find_jdbc_jars,
)
from persistence.analytics.tables import LONG, TABLES, AnalyticsLoadError
from persistence.analytics.waiting import with_stuck_columns, with_waits

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


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
            check_identifier(source.schema)
    jars = find_jdbc_jars(jar_search)
    search = ", ".join(str(p) for p in (jar_search or ["$FIBERFLOW_JDBC_JARS or /usr/share/java"]))
    owns_staging = staging_dir is None
    staging = Path(staging_dir or tempfile.mkdtemp(prefix="fiberflow-analytics-"))
    staging.mkdir(parents=True, exist_ok=True)
    cleanup: list[Callable[[], None]] = []
    if owns_staging:
        cleanup.append(lambda: shutil.rmtree(staging, ignore_errors=True))
    opened_all: list[OpenedDatabase] = []
    try:
        order = {source.name: i for i, source in enumerate(sources)}
        for group in _group(sources):
            if group[0].dialect == "sqlite":
                opened = open_sqlite(group[0], staging, order[group[0].name])
            else:
                opened = open_postgresql(group)
            opened_all.append(opened)
            cleanup.append(closer(opened.connection))
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
        frames, released = union_and_verify(parts, loads)
        cleanup += released
        if not all(source.named for source in sources):
            frames, loads = apply_names(frames, loads, infer_node_names(frames, sources))
        nodes = [loads[source.name] for source in sources]
        databases = {
            loads[source.name].name: (opened, source)
            for opened in opened_all
            for source in opened.sources
        }
        return Snapshot(
            spark=spark, nodes=nodes, frames=frames, cleanup=cleanup, databases=databases
        )
    except BaseException:
        while cleanup:
            cleanup.pop()()
        raise


def union_and_verify(
    parts: dict[str, list[DataFrame]], loads: dict[str, NodeLoad]
) -> tuple[dict[str, DataFrame], list[Callable[[], None]]]:
    """Union the nodes' frames per table, cache them and check the row counts.

    Returns the frames and what releases their cache when the names are put in place (the
    renamed frames are new ones, cached by the snapshot itself).
    """
    frames = _union_and_cache(parts, cache=True)
    _verify_counts(frames, loads)
    return frames, [_unpersister(list(frames.values()))]


def _unpersister(frames: list[DataFrame]) -> Callable[[], None]:
    def release() -> None:
        for frame in frames:
            frame.unpersist()

    return release


def _load_source(
    spark: SparkSession,
    opened: OpenedDatabase,
    source: NodeSource,
    reading: tuple[JdbcJars, ReadPath, str],
    staging: Path,
    partitioning: tuple[int, int],
    order: dict[str, int],
) -> tuple[NodeLoad, dict[str, DataFrame]]:
    from pyspark.sql import functions as F

    jars, path, search = reading
    max_partitions, rows_per_partition = partitioning

    chosen, detail, jar = choose_path(spark, source.dialect, jars, path, search)
    rows = {frame: count_rows(opened, source, TABLES[frame][0]) for frame in TABLES}
    frames: dict[str, DataFrame] = {}
    most = 1
    for frame, (_, _, columns) in TABLES.items():
        if jar is not None:
            partitions = plan_partitions(rows[frame], max_partitions, rows_per_partition)
            most = max(most, partitions)
            data = read_jdbc(spark, opened, source, frame, jar, partitions)
        else:
            folder = staging / f"node{order[source.name]}-parquet"
            data = read_arrow(spark, opened, source, frame, folder)
        typed = [
            F.col(name).cast("bigint" if kind == LONG else "string").alias(name)
            for name, kind in columns
        ]
        frames[frame] = data.select(F.lit(source.name).alias("node"), *typed)
        if frame == "checkpoints":  # parsed once, before the cache (see waiting.py)
            frames[frame] = with_stuck_columns(with_waits(frames[frame]))
        if frame in FACT_FRAMES:  # the same (see flow_facts.py)
            frames[frame] = with_facts(frames[frame])
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


def union_frames(parts: dict[str, list[DataFrame]]) -> dict[str, DataFrame]:
    """Each table's frame: the union of the nodes' frames (nothing cached, nothing counted)."""
    return _union_and_cache(parts, cache=False)


def _union_and_cache(parts: dict[str, list[DataFrame]], cache: bool) -> dict[str, DataFrame]:
    from pyspark import StorageLevel

    frames: dict[str, DataFrame] = {}
    for frame, datas in parts.items():
        combined = datas[0]
        for data in datas[1:]:
            combined = combined.unionByName(data)
        frames[frame] = combined.persist(StorageLevel.MEMORY_AND_DISK) if cache else combined
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
