"""The bulk writes of one SQLite transaction, run straight on the sqlite3 cursor.

A state machine transaction writes a few tables with one ``executemany`` each, hundreds of
rows in a busy round. Through SQLAlchemy's ``Connection.execute`` every row's parameters go
through the compiled statement's parameter processing in Python, which cost about as much as
SQLite's own work on those rows. :class:`SqliteWrites` compiles each statement once (SQL text
with ``?`` placeholders and the order of their parameters), turns each row into a tuple in
that order, and hands the rows to ``sqlite3``'s ``executemany`` on the SQLAlchemy
connection's own DBAPI connection, in its open transaction. The values written are plain
``str``, ``int``, ``bytes`` and ``None``, which need no conversion.

Each statement is told to the engine's ``before_cursor_execute`` listeners as SQLAlchemy
would (without an execution context), so counters and tracing see it, and a ``sqlite3``
error is raised as SQLAlchemy raises it (``IntegrityError`` for a dedup id consumed twice,
``OperationalError`` for a locked database), so the node's error handling sees the usual
types.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table, bindparam, delete
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import Executable

_COMPILED: dict[Executable, tuple[str, tuple[str, ...]]] = {}
"""(SQL text, parameter names in placeholder order) by statement: statements are immutable."""


def compiled_positional(
    statement: Executable, connection: Connection
) -> tuple[str, tuple[str, ...]]:
    """``statement`` as SQLite runs it, and the names of its parameters in order."""
    known = _COMPILED.get(statement)
    if known is None:
        compiled: Any = statement.compile(dialect=connection.dialect)  # type: ignore[attr-defined]
        names = tuple(compiled.positiontup or ())
        known = _COMPILED[statement] = (str(compiled), names)
    return known


_DELETES: dict[tuple[Table, str], Executable] = {}


def delete_one(table: Table, key: str) -> Executable:
    """``DELETE FROM table WHERE key = :key``, built once (run once per id by executemany)."""
    statement = _DELETES.get((table, key))
    if statement is None:
        statement = _DELETES[(table, key)] = delete(table).where(table.c[key] == bindparam(key))
    return statement


class SqliteWrites:
    """``executemany`` on the sqlite3 cursor of a SQLAlchemy connection's open transaction."""

    def __init__(self, connection: Connection) -> None:
        """Write through ``connection`` (SQLite, a transaction begun)."""
        raw = connection.connection.driver_connection
        if raw is None:
            raise RuntimeError("the connection has no sqlite3 connection under it")
        self._connection = connection
        self._cursor: Any = raw.cursor()

    def execute_many(self, statement: Executable, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run ``statement`` once per row (each row holding every parameter it names)."""
        if not rows:
            return
        sql, names = compiled_positional(statement, self._connection)
        parameters = [tuple(row[name] for name in names) for row in rows]
        self._connection.dispatch.before_cursor_execute(
            self._connection, self._cursor, sql, parameters, None, True
        )
        try:
            self._cursor.executemany(sql, parameters)
        except sqlite3.Error as error:
            raise DBAPIError.instance(
                sql, parameters[:3], error, sqlite3.Error, dialect=self._connection.dialect
            ) from error

    def delete_many(self, table: Table, key: str, ids: Sequence[str]) -> None:
        """Delete the rows of ``table`` whose ``key`` is one of ``ids`` (one executemany)."""
        self.execute_many(delete_one(table, key), [{key: value} for value in ids])
