"""Opening a database through SQLAlchemy, as every SQL part of fiberflow does it.

The node database (:mod:`persistence.store`), the SQL queue (:mod:`messaging.sqlqueue`),
analytics and the benchmarks share these: URL normalisation (psycopg 3 for PostgreSQL),
SQLite's settings (WAL, ``synchronous``, a busy timeout, explicit ``BEGIN``), engine creation
(a PostgreSQL schema of the node's own, connections named after the worker), creating tables
safely while other processes do the same, an upsert, and telling a connect error that waiting
will not cure from one it will.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    MetaData,
    create_engine,
    delete,
    event,
    insert,
    inspect,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.schema import CreateSchema, DropSchema

T = TypeVar("T")

QUERY_CHUNK = 500
"""Ids per ``IN (...)`` query (well under every backend's bound-parameter limit)."""

SQLITE_BEGIN_OPTION = "fiberflow_sqlite_begin"
"""Execution option: ``"IMMEDIATE"`` makes a SQLite transaction take the write lock at BEGIN;
:data:`NO_BEGIN` issues no BEGIN at all (reads of one statement, :func:`read_engine`)."""
NO_BEGIN = "NONE"


DATABASE_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg")
"""The URL schemes of the databases fiberflow runs on (SQLite, PostgreSQL through psycopg)."""


def database_url_problem(url: str) -> str | None:
    """Why ``url`` cannot name a fiberflow database (not a URL, another database), or None."""
    if "://" not in url:
        return f"{url!r} is not a URL (e.g. sqlite:///alice.db)"
    scheme = url.split("://", 1)[0].lower()
    if scheme not in DATABASE_SCHEMES:
        return (
            f"unsupported database scheme {scheme!r} in {url.split('://', 1)[0]}://...: "
            "fiberflow runs on sqlite:///path.db or postgresql://user@host/db"
        )
    return None


def normalize_url(url: str) -> str:
    """Pick psycopg (version 3) for plain ``postgresql://`` URLs; leave others alone."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def open_engine(
    url: str,
    *,
    synchronous: str = "FULL",
    schema_name: str | None = None,
    application_name: str | None = None,
    create_schema: bool = True,
) -> Engine:
    """An engine on ``url`` (normalised), configured for fiberflow.

    SQLite: :func:`configure_sqlite` with ``synchronous``; a ``schema_name`` is refused (SQLite
    keeps a node per file). PostgreSQL: with ``schema_name``, the schema is created if missing
    (unless not ``create_schema``) and every table of the engine's statements is put in it (a
    schema translate map);
    ``application_name`` names the connections (see :func:`persistence.lease.application_name`).
    """
    url = normalize_url(url)
    connect_args: dict[str, Any] = {}
    if application_name is not None and url.startswith("postgresql"):
        connect_args["application_name"] = application_name
    engine = create_engine(url, connect_args=connect_args)
    if engine.dialect.name == "sqlite":
        if schema_name is not None:
            raise ValueError("a schema name is for PostgreSQL; SQLite keeps a node per file")
        configure_sqlite(engine, synchronous)
    elif schema_name is not None:
        if create_schema:
            try:
                create_schema_once(engine, schema_name)
            except BaseException:
                engine.dispose()  # no pooled connection is left for the garbage collector
                raise
        engine = engine.execution_options(schema_translate_map={None: schema_name})
    return engine


def create_schema_once(engine: Engine, schema_name: str) -> None:
    """Create the PostgreSQL schema ``schema_name`` if it is missing, safely against races.

    ``CREATE SCHEMA IF NOT EXISTS`` alone is not enough when two processes (two workers of a
    node) run it at the same moment: one of them fails on the catalogue's unique index. A
    transaction-scoped advisory lock on the schema's name makes the second wait for the first
    and then find the schema there.
    """
    with engine.begin() as connection:
        lock_schema_creation(connection, schema_name)
        connection.execute(CreateSchema(schema_name, if_not_exists=True))


def lock_schema_creation(connection: Connection, schema_name: str | None) -> None:
    """Serialise creating ``schema_name`` or its tables among processes.

    PostgreSQL: wait for, then hold to the end of the transaction, an advisory lock named
    after the schema. SQLite: nothing (its IMMEDIATE transactions already serialise writers).
    """
    if connection.dialect.name == "postgresql":
        connection.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:name))"),
            {"name": f"fiberflow schema {schema_name or 'public'}"},
        )


def write_engine(engine: Engine) -> Engine:
    """``engine`` for transactions that read before they write (IMMEDIATE on SQLite)."""
    return engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})


def read_engine(engine: Engine) -> Engine:
    """``engine`` for reads of one statement each, on the same connections.

    PostgreSQL: in autocommit mode, so a read costs one round trip (no ``BEGIN``, no
    ``ROLLBACK`` when the connection goes back to the pool). SQLite: no ``BEGIN`` is issued;
    the statement runs in SQLite's own implicit transaction (one consistent snapshot). A read
    of several statements that must agree with each other uses ``engine`` itself.
    """
    if engine.dialect.name == "postgresql":
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine.execution_options(**{SQLITE_BEGIN_OPTION: NO_BEGIN})


def existing_tables(connection: Connection) -> set[str]:
    """The names of the tables in the connection's schema (the node's, on PostgreSQL).

    The inspector does not follow ``schema_translate_map``, so the schema it maps the
    default to is named explicitly.
    """
    translate = connection.get_execution_options().get("schema_translate_map") or {}
    return set(inspect(connection).get_table_names(schema=translate.get(None)))


def create_tables(engine: Engine, metadata: MetaData) -> None:
    """``metadata.create_all`` safely while other processes may be doing the same.

    When every table exists already this only reads: no write lock is taken, so a process
    can start while another holds SQLite's write lock (a busy or a frozen process).
    """
    with engine.connect() as connection:
        present = existing_tables(connection)
    if {table.name for table in metadata.sorted_tables} <= present:
        return
    with write_engine(engine).begin() as connection:
        metadata.create_all(connection)


def drop_schema(url: str, schema_name: str) -> None:
    """Drop a PostgreSQL schema and everything in it (tests and tools)."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.begin() as connection:
            connection.execute(DropSchema(schema_name, cascade=True, if_exists=True))
    finally:
        engine.dispose()


def chunks(items: Sequence[T]) -> Iterator[list[T]]:
    """``items`` in lists of at most :data:`QUERY_CHUNK` (one ``IN (...)`` query each)."""
    for start in range(0, len(items), QUERY_CHUNK):
        yield list(items[start : start + QUERY_CHUNK])


def upsert(connection: Connection, table: Any, rows: Sequence[dict[str, Any]], key: str) -> None:
    """Insert ``rows``, replacing existing rows with the same ``key`` (later rows win)."""
    if not rows:
        return
    statement = upsert_statement(connection.dialect.name, table, key)
    if statement is None or len({row[key] for row in rows}) != len(rows):
        for row in rows:  # portable, and ordered when a key repeats
            connection.execute(delete(table).where(table.c[key] == row[key]))
            connection.execute(insert(table).values(**row))
        return
    connection.execute(statement, rows)


def upsert_statement(dialect_name: str, table: Any, key: str) -> Any:
    """``INSERT ... ON CONFLICT (key) DO UPDATE`` of every column of ``table``, or None.

    Built once per table (building it makes a proxy of every column); None for a dialect
    without it (SQLite and PostgreSQL have it).
    """
    module: Any = {"sqlite": sqlite, "postgresql": postgresql}.get(dialect_name)
    if module is None:
        return None
    cache_key = (dialect_name, table, key)
    statement = _UPSERTS.get(cache_key)
    if statement is None:
        insert_rows = module.insert(table)
        updates = {c.name: insert_rows.excluded[c.name] for c in table.columns if c.name != key}
        statement = insert_rows.on_conflict_do_update(index_elements=[key], set_=updates)
        _UPSERTS[cache_key] = statement
    return statement


_UPSERTS: dict[tuple[str, Any, str], Any] = {}
"""Upsert statements by (dialect, table, key): SQLAlchemy statements are immutable values."""


_PERMANENT_CONNECT_PROBLEMS = (
    "does not exist",  # a missing database or role
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "unable to open database file",  # SQLite: a missing directory, or no right to write
    "invalid dsn",
    "invalid connection option",
)


def is_permanent_connect_error(error: BaseException) -> bool:
    """True if connecting failed for a reason waiting will not cure.

    Permanent: a wrong password, a missing database or role, a SQLite file that cannot be
    opened. Not permanent: refused, timed out, the server starting up or full.
    """
    text = str(getattr(error, "orig", None) or error).lower()
    return any(problem in text for problem in _PERMANENT_CONNECT_PROBLEMS)


def _switch_to_wal(cursor: Any) -> None:
    """Set WAL mode; retried, since SQLite does not wait on the lock this needs.

    (Two processes opening a new database file at once: one converts it to WAL while the
    other gets "database is locked" at once, busy timeout or not.)
    """
    delay = 0.005
    for attempt in range(12):
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or attempt == 11:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def configure_sqlite(engine: Engine, synchronous: str) -> None:
    """WAL, the given ``synchronous`` level, a 10 s busy timeout, and explicit BEGIN."""
    if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves, below
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=10000")  # first: the others may wait for a lock
        _switch_to_wal(cursor)
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # A transaction that reads before it writes must say so up front (IMMEDIATE):
        # SQLite cannot upgrade a read lock while another connection writes, and fails
        # at once with "database is locked" instead of waiting.
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "")
        if mode != NO_BEGIN:
            connection.exec_driver_sql(f"BEGIN {mode}".strip())


def application_name(worker_id: str) -> str:
    """The PostgreSQL ``application_name`` of a worker's database sessions."""
    return f"fiberflow {worker_id}"


def first_line(error: BaseException) -> str:
    """The first line of an error's message (drivers add hints and SQL on later lines)."""
    text = str(getattr(error, "orig", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def url_without_password(url: str) -> str:
    """``url`` with its password hidden (for messages and logs)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        credentials, host = rest.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
    return url


def end_sessions(connection: Connection, worker_ids: Sequence[str]) -> int:
    """PostgreSQL: end every database session of these workers (not this one); how many.

    A worker's sessions are known by their :func:`application_name`.
    """
    if not worker_ids:
        return 0
    return int(
        connection.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = ANY(:names) AND pid <> pg_backend_pid()"
            ),
            {"names": [application_name(worker_id) for worker_id in worker_ids]},
        ).scalar_one()
    )
