"""An incremental export of the node tables to Parquet, which ``fiberflow analyze`` reads.

``fiberflow analyze --node ... --export-dir DIR`` first brings DIR up to date with the node
databases, then analyzes DIR's Parquet files instead of reading the databases over JDBC
(``--export-only`` stops after the export). The export runs in Python without Spark, from
one consistent snapshot per database, like :mod:`persistence.analytics.opening`: one SQLite
read transaction (``BEGIN`` and every query in it), or one PostgreSQL ``REPEATABLE READ READ
ONLY`` transaction for every node schema in that database.

Per node and table it keeps one Parquet file with the columns the checks read
(:data:`~persistence.analytics.snapshot.TABLES`) and, in the manifest, the table's
**watermark** (the largest time column value exported). A refresh:

1. reads the rows whose time column (``updated_at``, ``inserted_at``, ...) is above the
   watermark less :data:`LATE_COMMIT_MS` (new and updated rows: every checkpoint write sets
   ``updated_at``), and the database's **fingerprint** of every key bucket (the key's
   first :data:`BUCKET_CHARS` characters after its ``N-`` prefix, if any: 1,048,576 buckets
   of hex ids):
   rows, the sum and maximum of the time column, the sum of the key lengths and, for
   ``node_checkpoints``, the sum of ``checkpoint_version``;
2. applies the new rows to the exported ones (replacing rows of the same key) and computes
   the same fingerprints from the result with Arrow;
3. re-reads from the database every bucket whose fingerprint differs (a deleted row: fewer
   rows; a row changed with an old time: a different version sum or time sum), and checks
   that afterwards every bucket's fingerprint matches, or raises.

So a deleted, an updated and a new row are all seen; what passes through Python is the
changed rows and the re-read buckets, while the rest of the file is rewritten by Arrow (C++).
A miss would need, between two exports, a row deleted and another inserted in the same
bucket with the inserted one's time below the watermark less :data:`LATE_COMMIT_MS`, and
both rows with the same time, key length and version: a commit more than ten minutes late
and a collision of millisecond times.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import Connection, text

from persistence.analytics.flow_facts import (
    FACT_FRAMES,
    FACTS,
    FACTS_TEXT,
    arrow_facts,
    arrow_facts_type,
)
from persistence.analytics.opening import check_identifier, open_postgresql, qualified_table
from persistence.analytics.sources import NodeSource, check_unique_names
from persistence.analytics.tables import LONG, TABLES, AnalyticsLoadError
from persistence.analytics.waiting import (
    UNTIL,
    WAITS,
    arrow_waits,
    arrow_waits_type,
)
from statemachine.session_ids import MESSAGE_ID_PREFIX

if TYPE_CHECKING:
    import pyarrow

BUCKET_CHARS = 5
"""Key characters (after the ``N-`` of message ids) that name a fingerprint bucket: 5 hex
digits, 1,048,576 buckets, so a row deleted re-reads a handful of rows, not a 4,096th of
the table."""
LATE_COMMIT_MS = 10 * 60_000
"""How far below the watermark new rows are looked for (a transaction that stamped its rows
before the last export's snapshot and committed after it)."""
TIME_COLUMNS = {
    "checkpoints": "updated_at",
    "results": "completed_at",
    "exceptions": "failed_at",
    "message_ids": "inserted_at",
    "outbox": "created_at",
    "paused": "paused_at",
}
"""The time column of each table: new and changed rows have it above the watermark.

A table without one (``node_checkpoint_blobs``: only ``flow_id`` is exported; the small
``node_workers``, whose ``renewed_at`` changes all the time) is exported whole on every
refresh: one narrow column of about as many rows as the checkpoints, for the blobs."""
VERSION_COLUMNS = {"checkpoints": "checkpoint_version"}
"""Columns exported for the fingerprint only (not read by the checks)."""
MANIFEST = "manifest.json"
"""The export's manifest in the export folder."""
FORMAT = 6
"""The layout of the exported files; a node exported in another layout is exported again in
full. The checkpoints carry the parsed ``waits`` and ``until``
(:mod:`persistence.analytics.waiting`); the checkpoints, results and exceptions their parsed
``facts`` (:mod:`persistence.analytics.flow_facts`)."""


@attrs.frozen
class TableExport:
    """What one refresh of one table did."""

    rows: int
    """Rows in the export afterwards."""
    changed: int
    """Rows read because their time is above the watermark (new and updated rows)."""
    buckets: int
    """Buckets re-read because their fingerprint differed (deleted rows, late commits)."""
    reread: int
    """Rows read in those buckets."""


@attrs.frozen
class NodeExport:
    """One node's refreshed export."""

    name: str
    argument: str
    """The ``--node`` argument (``NAME=URL`` or a plain URL), to name it again when read."""
    url: str
    snapshot: str
    taken_at_ms: int
    seconds: float
    full: bool
    """The first export of this node (every row read)."""
    tables: dict[str, TableExport]


def _key_info(frame: str) -> tuple[str, str, int]:
    """(key column, its usual prefix, the characters of the key that name its bucket)."""
    _, key, _ = TABLES[frame]
    prefix = MESSAGE_ID_PREFIX if key == "message_id" else ""
    return key, prefix, len(prefix) + BUCKET_CHARS


def _columns(frame: str) -> list[tuple[str, str]]:
    columns = list(TABLES[frame][2])
    if frame in VERSION_COLUMNS:
        columns.append((VERSION_COLUMNS[frame], LONG))
    return columns


def _schema(frame: str) -> pyarrow.Schema:
    """The Parquet file's columns: those read from the table, then the parsed ones."""
    import pyarrow as pa

    fields = [(name, pa.int64() if kind == LONG else pa.string()) for name, kind in _columns(frame)]
    if frame == "checkpoints":
        fields += [(WAITS, arrow_waits_type()), (UNTIL, pa.int64())]
    if frame in FACT_FRAMES:
        fields.append((FACTS, arrow_facts_type()))
    return pa.schema(fields)


class _Reader:
    """Queries inside one database snapshot (SQLite read transaction or PostgreSQL)."""

    def __init__(self, sqlite: sqlite3.Connection | None, postgresql: Connection | None) -> None:
        self.sqlite = sqlite
        self.postgresql = postgresql

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row of ``sql`` (``?`` placeholders)."""
        return [row for chunk in self.chunks(sql, params) for row in chunk]

    def chunks(
        self, sql: str, params: Sequence[Any] = (), size: int = 50_000
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The rows of ``sql`` in chunks of ``size`` (streamed, not all in memory)."""
        if self.sqlite is not None:
            cursor = self.sqlite.execute(sql, tuple(params))
            while chunk := cursor.fetchmany(size):
                yield chunk
            return
        assert self.postgresql is not None
        names = {f"p{i}": value for i, value in enumerate(params)}
        for i in range(len(params)):
            sql = sql.replace("?", f":p{i}", 1)
        result = self.postgresql.execution_options(stream_results=True, yield_per=size).execute(
            text(sql), names
        )
        for part in result.partitions(size):  # without the size: every row at once
            yield [tuple(row) for row in part]


@contextmanager
def _snapshot(group: list[NodeSource]) -> Iterator[tuple[_Reader, str, int]]:
    """One consistent snapshot of the database of ``group``: (reader, description, time)."""
    source = group[0]
    if source.dialect == "sqlite":
        path = source.sqlite_path
        if not path.exists():
            raise AnalyticsLoadError(f"{source.name}: no database file {path}")
        connection = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
        )
        try:
            connection.execute("PRAGMA busy_timeout=10000")
            connection.execute("BEGIN")
            connection.execute("SELECT count(*) FROM node_checkpoints").fetchone()  # snapshot
            taken = time.time()
            yield (
                _Reader(connection, None),
                f"SQLite read transaction on {path} at {iso_time(taken)}",
                round(taken * 1000),
            )
        finally:
            connection.close()
        return
    opened = open_postgresql(group)
    try:
        yield _Reader(None, opened.connection), opened.description, opened.taken_at_ms
    finally:
        try:
            opened.connection.rollback()
        finally:
            opened.connection.close()
            opened.connection.engine.dispose()


def iso_time(seconds: float) -> str:
    """A moment (epoch seconds) in ISO-8601, UTC, to the millisecond."""
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        + f".{int(seconds % 1 * 1000):03d}Z"
    )


def _fingerprint_sql(frame: str, table: str) -> str:
    key, _, chars = _key_info(frame)
    when = TIME_COLUMNS[frame]
    version = f"sum({VERSION_COLUMNS[frame]})" if frame in VERSION_COLUMNS else "0"
    bucket = f"substr({key}, 1, {chars})"
    return (
        f"SELECT {bucket} AS b, count(*), sum({when}), max({when}), sum(length({key})), "
        f"{version} FROM {table} GROUP BY {bucket}"
    )


Fingerprints = dict[str, tuple[int, int, int, int, int]]


def _plain(value: Any) -> int:
    return int(value) if value is not None else 0


def _database_fingerprints(reader: _Reader, frame: str, table: str) -> Fingerprints:
    return {
        row[0] or "": (
            _plain(row[1]),
            _plain(row[2]),
            _plain(row[3]),
            _plain(row[4]),
            _plain(row[5]),
        )
        for row in reader.rows(_fingerprint_sql(frame, table))
    }


def _buckets(data: pyarrow.Table, frame: str) -> pyarrow.Array:
    import pyarrow.compute as pc

    key, _, chars = _key_info(frame)
    return pc.utf8_slice_codeunits(data[key], 0, chars)


def _export_fingerprints(data: pyarrow.Table, frame: str) -> Fingerprints:
    import pyarrow as pa
    import pyarrow.compute as pc

    key, _, _ = _key_info(frame)
    when = TIME_COLUMNS[frame]
    version = (
        data[VERSION_COLUMNS[frame]]
        if frame in VERSION_COLUMNS
        else pa.array([0] * len(data), pa.int64())
    )
    keyed = pa.table(
        {
            "b": _buckets(data, frame),
            "t": data[when],
            "l": pc.utf8_length(data[key]).cast(pa.int64()),
            "v": version,
        }
    )
    grouped = keyed.group_by("b").aggregate(
        [([], "count_all"), ("t", "sum"), ("t", "max"), ("l", "sum"), ("v", "sum")]
    )
    result: Fingerprints = {}
    for row in grouped.to_pylist():
        result[row["b"] or ""] = (
            _plain(row["count_all"]),
            _plain(row["t_sum"]),
            _plain(row["t_max"]),
            _plain(row["l_sum"]),
            _plain(row["v_sum"]),
        )
    return result


def _fetch(reader: _Reader, frame: str, table: str, where: str, params: Sequence[Any]) -> Any:
    """The rows of ``table`` matching ``where``, with what is derived once beside each row."""
    import pyarrow as pa

    schema = _schema(frame)
    selected_names = [name for name, _ in _columns(frame)]
    selected = ", ".join(selected_names)
    batches = []
    for chunk in reader.chunks(f"SELECT {selected} FROM {table} WHERE {where}", params):
        values = list(zip(*chunk, strict=True))
        column = {name: values[i] for i, name in enumerate(selected_names)}
        arrays = [pa.array(values[i], type=schema.field(i).type) for i in range(len(values))]
        if frame == "checkpoints":  # parsed once here, stored beside the row
            waits, until = arrow_waits(column["suspended_on"], column["waiting_for"])
            arrays += [waits, until]
        if frame in FACT_FRAMES:  # parsed once here too
            arrays.append(arrow_facts(column[FACTS_TEXT]))
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


def _key_range(bucket: str, chars: int) -> tuple[str, str]:
    """The keys of ``bucket`` as a range of the key (so the primary key index finds them).

    A bucket is the first ``chars`` characters of the key; a shorter bucket holds exactly
    one key (the key is that short). Compared byte by byte (``COLLATE "C"`` on PostgreSQL).
    """
    if len(bucket) < chars:
        return bucket, bucket + "\x00"
    return bucket, bucket[:-1] + chr(ord(bucket[-1]) + 1)


def _refresh_table(
    reader: _Reader, source: NodeSource, frame: str, target: Path, watermark: int | None
) -> tuple[TableExport, int | None]:
    """Bring ``target`` (one table's Parquet file) up to date; (what it did, new watermark)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = qualified_table(source, TABLES[frame][0])
    if frame not in TIME_COLUMNS:
        return _replace_table(reader, frame, table, target), watermark
    key, _, chars = _key_info(frame)
    when = TIME_COLUMNS[frame]
    wanted = _database_fingerprints(reader, frame, table)
    if watermark is None or not target.exists():
        data = _fetch(reader, frame, table, "1=1", ())
        changed, buckets, reread = len(data), len(wanted), 0
        unchanged = False
    else:
        old = pq.read_table(target, schema=_schema(frame))
        fresh = _fetch(reader, frame, table, f"{when} > ?", (watermark - LATE_COMMIT_MS,))
        replaced = pc.is_in(old[key], value_set=fresh[key].combine_chunks())
        data = pa.concat_tables([old.filter(pc.invert(replaced)), fresh])
        have = _export_fingerprints(data, frame)
        differ = sorted(b for b in set(wanted) | set(have) if wanted.get(b) != have.get(b))
        parts = [data]
        if differ:
            stale = pc.is_in(_buckets(data, frame), value_set=pa.array(differ, pa.string()))
            parts = [data.filter(pc.invert(stale))]
        reread = 0
        column = f'{key} COLLATE "C"' if source.dialect == "postgresql" else key
        for index in range(0, len(differ), 50):
            ranges = [_key_range(bucket, chars) for bucket in differ[index : index + 50]]
            where = " OR ".join(f"({column} >= ? AND {column} < ?)" for _ in ranges)
            bounds = [v for pair in ranges for v in pair]
            again = _fetch(reader, frame, table, where, bounds)
            reread += len(again)
            parts.append(again)
        data = pa.concat_tables(parts)
        changed, buckets = len(fresh), len(differ)
        unchanged = not differ and old.filter(replaced).sort_by(key).equals(fresh.sort_by(key))
    if _export_fingerprints(data, frame) != wanted:
        raise AnalyticsLoadError(
            f"{source.name}: the export of {TABLES[frame][0]} does not match the database "
            "after its refresh"
        )
    if not unchanged:  # the rows read again are the rows exported: keep the file
        temporary = target.with_suffix(f".{os.getpid()}.tmp")
        pq.write_table(data, temporary)
        temporary.replace(target)
    top = pc.max(data[when]).as_py() if len(data) else None
    known = [value for value in (top, watermark) if value is not None]
    mark = max(known) if known else None
    return TableExport(len(data), changed, buckets, reread), mark


def _replace_table(reader: _Reader, frame: str, table: str, target: Path) -> TableExport:
    """Export a table without a time column whole (see :data:`TIME_COLUMNS`)."""
    import pyarrow.parquet as pq

    data = _fetch(reader, frame, table, "1=1", ())
    temporary = target.with_suffix(f".{os.getpid()}.tmp")
    pq.write_table(data, temporary)
    temporary.replace(target)
    return TableExport(len(data), len(data), 0, 0)


def _group(sources: Sequence[NodeSource]) -> list[list[NodeSource]]:
    groups: dict[str, list[NodeSource]] = {}
    for index, source in enumerate(sources):
        key = source.url if source.dialect == "postgresql" else f"sqlite#{index}"
        groups.setdefault(key, []).append(source)
    return list(groups.values())


def _folder_name(name: str) -> str:
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    return "".join(c if c.isalnum() else "_" for c in name)[:60] + f"-{digest}"


def export_nodes(
    sources: Sequence[NodeSource], arguments: Sequence[str], directory: str | Path
) -> list[NodeExport]:
    """Refresh the Parquet export of ``sources`` in ``directory`` (the first time: all rows).

    ``arguments`` are the ``--node`` arguments of ``sources`` (kept in the manifest).
    """
    check_unique_names(sources)
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / MANIFEST
    manifest: dict[str, Any] = (
        json.loads(manifest_path.read_text()) if manifest_path.exists() else {"nodes": {}}
    )
    given = dict(zip((s.name for s in sources), arguments, strict=True))
    done: list[NodeExport] = []
    for group in _group(sources):
        for source in group:
            if source.schema is not None:
                check_identifier(source.schema)
        with _snapshot(group) as (reader, description, taken_at_ms):
            for source in group:
                began = time.perf_counter()
                entry = manifest["nodes"].get(source.name) or {
                    "folder": _folder_name(source.name),
                    "watermarks": {},
                }
                node_folder = folder / entry["folder"]
                node_folder.mkdir(exist_ok=True)
                full = not entry["watermarks"] or entry.get("format") != FORMAT
                tables: dict[str, TableExport] = {}
                marks: dict[str, int | None] = {}
                for frame in TABLES:
                    tables[frame], marks[frame] = _refresh_table(
                        reader,
                        source,
                        frame,
                        node_folder / f"{frame}.parquet",
                        entry["watermarks"].get(frame) if not full else None,
                    )
                export = NodeExport(
                    name=source.name,
                    argument=given[source.name],
                    url=source.display_url(),
                    snapshot=description,
                    taken_at_ms=taken_at_ms,
                    seconds=round(time.perf_counter() - began, 3),
                    full=full,
                    tables=tables,
                )
                manifest["nodes"][source.name] = {
                    "folder": entry["folder"],
                    "format": FORMAT,
                    "watermarks": marks,
                    "export": attrs.asdict(export),
                }
                temporary = manifest_path.with_suffix(f".{os.getpid()}.tmp")
                temporary.write_text(json.dumps(manifest, indent=2))
                temporary.replace(manifest_path)
                done.append(export)
    return done
