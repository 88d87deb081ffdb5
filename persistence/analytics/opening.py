"""Opening node databases at a consistent snapshot, one per database.

Separate reads of live tables are not one snapshot, so every read goes through one:

* SQLite (:func:`open_sqlite`): the database is first copied with SQLite's online backup
  (one read transaction, so the copy is a consistent snapshot of the file, also of a node
  that is running), and only the copy is read.
* PostgreSQL (:func:`open_postgresql`): one ``REPEATABLE READ READ ONLY`` transaction per
  database is opened and held while the tables are read; it exports its snapshot, so
  Spark's JDBC connections join it (``SET TRANSACTION SNAPSHOT``) and every node schema in
  that database is read as of one instant.

:func:`probe_source` checks a database before Spark starts, so a wrong argument fails fast.
Nothing here imports PySpark.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import attrs
from sqlalchemy import Connection, create_engine, inspect, text

from foundation.engine import normalize_url
from persistence.analytics.sources import NodeSource
from persistence.analytics.tables import TABLES, AnalyticsLoadError


@attrs.define
class OpenedDatabase:
    """A database opened at a snapshot: how to count and read its node tables."""

    sources: list[NodeSource]
    """The nodes whose tables are in it (several PostgreSQL schemas, or one SQLite file)."""
    connection: Connection
    """Held open at the snapshot until the analysis ends (see :func:`closer`)."""
    description: str
    """How the snapshot was taken, for the report."""
    taken_at_ms: int
    """Wall-clock time of the snapshot (ms since the epoch)."""
    jdbc_file: Path | None = None
    """The SQLite copy that JDBC reads (None for PostgreSQL)."""
    jdbc_init: str | None = None
    """The statement that makes a JDBC connection join the PostgreSQL snapshot."""


def probe_source(source: NodeSource, timeout_s: int = 5) -> None:
    """Fail fast, before Spark starts: the database opens and holds a node's tables.

    Raises :class:`AnalyticsLoadError` naming the node, the URL (password hidden) and what
    is wrong (no such file, not a SQLite file, cannot connect, no fiberflow tables).
    """
    wanted = [table for table, _, _ in TABLES.values()]  # the flow tables first
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
    missing = [table for table in wanted if table not in found]
    if missing:
        place = f" (schema {source.schema})" if source.schema else ""
        raise AnalyticsLoadError(
            f"{where}{place} is not a fiberflow node database: no table {', '.join(missing)}"
        )


def qualified_table(source: NodeSource, table: str) -> str:
    """``table`` in ``source``'s schema, quoted (as is when it has none)."""
    if source.schema is None:
        return table
    return f'"{source.schema}"."{table}"'


def check_identifier(value: str) -> str:
    """``value`` if it is a plain SQL identifier (a schema name), else an error."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", value):
        raise AnalyticsLoadError(f"schema name {value!r} is not a plain identifier")
    return value


def open_sqlite(source: NodeSource, staging: Path, index: int) -> OpenedDatabase:
    """Copy ``source``'s SQLite file into ``staging`` (online backup) and open the copy."""
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
    return OpenedDatabase(
        sources=[source],
        connection=connection,
        description=f"SQLite online backup of {path} at {when}",
        taken_at_ms=round(taken_at * 1000),
        jdbc_file=copy,
    )


def open_postgresql(sources: list[NodeSource]) -> OpenedDatabase:
    """Open one held ``REPEATABLE READ`` transaction on the database of ``sources``.

    ``sources`` are nodes in one PostgreSQL database (a schema each); the transaction
    exports its snapshot for the JDBC connections to join.
    """
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
    return OpenedDatabase(
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


def count_rows(opened: OpenedDatabase, source: NodeSource, table: str) -> int:
    """The rows of ``source``'s ``table`` in the snapshot."""
    try:
        query = text(f"SELECT count(*) FROM {qualified_table(source, table)}")
        return int(opened.connection.execute(query).scalar_one())
    except Exception as error:
        raise AnalyticsLoadError(
            f"{source.name}: cannot read {table} from {source.display_url()} "
            f"(is it a fiberflow node database?): {error}"
        ) from error


def closer(connection: Connection) -> Callable[[], None]:
    """A function that ends the snapshot's transaction and closes ``connection``."""

    def close() -> None:
        try:
            connection.rollback()
        finally:
            connection.close()
            connection.engine.dispose()

    return close
