"""Reading a snapshot's node tables into Spark: over JDBC, or through Arrow and Parquet.

Two paths, and the report says which one each node took (:func:`choose_path`):

* **JDBC** (the default when a driver jar is found, see ``find_jdbc_jars``): Spark reads the
  tables itself (:func:`read_jdbc`), split into up to ``max_partitions`` key ranges per table
  (:func:`range_predicates`: the keys are hex flow ids, and message ids ``N-<flow id>...``,
  so ranges of the first hex digit after the prefix are even). Every column gets an
  explicit type (``customSchema``): the SQLite driver would otherwise read ``INTEGER`` as 32
  bits and silently wrap millisecond timestamps.
* **Arrow** (no jar, or ``path="arrow"``): the tables are streamed through SQLAlchemy into
  Arrow record batches with 64-bit integer columns, written as Parquet in the staging folder,
  and Spark reads the Parquet (:func:`read_arrow`).

Both read from an :class:`~persistence.analytics.opening.OpenedDatabase`, that is from its
consistent snapshot.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sqlalchemy import text

from persistence.analytics.opening import OpenedDatabase, qualified_table
from persistence.analytics.sources import JDBC_DRIVER_CLASSES, JdbcJars, NodeSource, jdbc_url
from persistence.analytics.tables import LONG, TABLES, AnalyticsLoadError
from statemachine.session_ids import MESSAGE_ID_PREFIX

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame, SparkSession

ReadPath = Literal["auto", "jdbc", "arrow"]
"""How to read the tables: ``auto`` (JDBC when its jar is found, else Arrow) or forced."""

ROWS_PER_PARTITION = 250_000
"""Rows a JDBC partition reads (at most ``max_partitions`` partitions per table)."""

ARROW_ROWS = 50_000
"""Rows per chunk (and Parquet row group) of the Arrow fallback read."""

HEX_DIGITS = "0123456789abcdef"
"""The first characters of the keys (hex flow ids), in order: the partition boundaries."""


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


def _jar_on_classpath(spark: SparkSession, jar: Path) -> bool:
    configured = spark.sparkContext.getConf().get("spark.jars", "") or ""
    names = {Path(item.removeprefix("file:")).name for item in configured.split(",") if item}
    return jar.name in names or str(jar) in configured


def choose_path(
    spark: SparkSession, dialect: str, jars: JdbcJars, path: ReadPath, search: str
) -> tuple[str, str, Path | None]:
    """The path to read a ``dialect`` database by: (``"jdbc"`` or ``"arrow"``, why, the jar).

    ``auto`` falls back to Arrow when no jar is found in ``search`` or the Spark session was
    started without it; a forced ``jdbc`` raises :class:`AnalyticsLoadError` instead.
    """
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


def read_jdbc(
    spark: SparkSession,
    opened: OpenedDatabase,
    source: NodeSource,
    frame: str,
    jar: Path,
    partitions: int,
) -> DataFrame:
    """Have Spark read ``frame`` of ``source`` over JDBC, in ``partitions`` key ranges."""
    table, key, columns = TABLES[frame]
    url, properties = jdbc_url(source, opened.jdbc_file)
    properties = dict(properties, driver=JDBC_DRIVER_CLASSES[source.dialect])
    properties["customSchema"] = _spark_schema(columns)
    if source.dialect == "postgresql":
        properties["fetchsize"] = "10000"
        assert opened.jdbc_init is not None
        properties["sessionInitStatement"] = opened.jdbc_init
    selected = ", ".join(name for name, _ in columns)
    query = f"(SELECT {selected} FROM {qualified_table(source, table)}) AS snapshot_rows"
    prefix = MESSAGE_ID_PREFIX if key == "message_id" else ""
    predicates = range_predicates(key, prefix, partitions, source.dialect)
    return spark.read.jdbc(url, query, predicates=predicates, properties=properties)


def read_arrow(
    spark: SparkSession, opened: OpenedDatabase, source: NodeSource, frame: str, folder: Path
) -> DataFrame:
    """Stream ``frame`` of ``source`` into a Parquet file in ``folder``; Spark reads that."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table, _, columns = TABLES[frame]
    schema = _arrow_schema(columns)
    selected = ", ".join(name for name, _ in columns)
    query = text(f"SELECT {selected} FROM {qualified_table(source, table)}")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{frame}.parquet"
    result = opened.connection.execution_options(stream_results=True, yield_per=ARROW_ROWS).execute(
        query
    )
    with pq.ParquetWriter(target, schema) as writer:
        wrote = False
        # The size must be given: without it SQLite yields one-row chunks (a Parquet row
        # group per row) and PostgreSQL one chunk of every row (SQLAlchemy 2.1).
        for chunk in result.partitions(ARROW_ROWS):
            values = list(zip(*chunk, strict=True))
            arrays = [pa.array(values[i], type=schema.field(i).type) for i in range(len(columns))]
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
            wrote = True
        if not wrote:
            writer.write_table(schema.empty_table())
    return spark.read.parquet(str(target))
