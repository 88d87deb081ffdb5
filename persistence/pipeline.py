"""The writes of one PostgreSQL transaction, sent without waiting for each: one round trip.

A state machine transaction writes several tables (checkpoints, blobs, dedup ids, outbox,
outcomes). Sent one by one, each statement waits for the server: a round trip per
statement, on a machine where the server competes with the node for the processor. In
psycopg's pipeline mode the statements are sent as they come and the client waits once, for
all of them, when the transaction commits: :class:`Pipeline` queues the writes of an open
transaction (on the SQLAlchemy connection's psycopg connection), and :meth:`Pipeline.commit`
sends ``COMMIT`` behind them and waits for everything. If a statement fails, the server skips
the rest, ``COMMIT`` included, and the error is raised then (as SQLAlchemy would raise it,
so the node's error handling sees the usual types).

Statements are SQLAlchemy Core statements with named bind parameters, compiled once per
(statement, schema) and reused; psycopg prepares them on the server after a few executions.
Each is told to the engine's ``before_cursor_execute`` listeners as SQLAlchemy would (without
an execution context), so counters and tracing see them.
The lease check that starts every transaction (:mod:`persistence.fencing`) runs before the
pipeline opens and is waited for: nothing is queued, and nothing can commit, unless it held.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import Executable

_COMPILED: dict[tuple[Executable, str | None], str] = {}
"""SQL text by (statement, schema): statements are immutable values built once."""


def compiled_sql(statement: Executable, connection: Connection) -> str:
    """``statement`` as the SQL text psycopg runs on ``connection`` (its schema rendered)."""
    translate = connection.get_execution_options().get("schema_translate_map") or {}
    schema_name = translate.get(None)
    key = (statement, schema_name)
    sql = _COMPILED.get(key)
    if sql is None:
        sql = str(
            statement.compile(  # type: ignore[attr-defined]
                dialect=connection.dialect,
                schema_translate_map=translate or None,
                render_schema_translate=bool(translate),
            )
        )
        _COMPILED[key] = sql
    return sql


class Pipeline:
    """Writes queued in psycopg's pipeline mode, in the connection's open transaction."""

    def __init__(self, connection: Connection) -> None:
        """Enter pipeline mode on ``connection`` (PostgreSQL, a transaction begun)."""
        self._connection = connection
        raw = connection.connection.driver_connection
        if raw is None:
            raise RuntimeError("the connection has no psycopg connection under it")
        self._raw: Any = raw
        self._cursor: Any = raw.cursor()
        self._pipeline: Any = None
        self._context: Any = None
        with self._translated():
            self._context = raw.pipeline()
            self._pipeline = self._context.__enter__()

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """Raise psycopg's errors as SQLAlchemy raises them (a dead connection invalidated)."""
        import psycopg

        try:
            yield
        except psycopg.Error as error:
            caught: Any = error
            disconnected = self._connection.dialect.is_disconnect(caught, self._raw, self._cursor)
            if disconnected:
                self._connection.invalidate(error)
            raise DBAPIError.instance(
                None,
                None,
                error,
                psycopg.Error,
                connection_invalidated=disconnected,
                dialect=self._connection.dialect,
            ) from error

    def execute(
        self, statement: Executable, rows: Sequence[Mapping[str, Any]] | Mapping[str, Any]
    ) -> Any:
        """Queue ``statement`` once, or once per row; returns the cursor (results after sync)."""
        sql = compiled_sql(statement, self._connection)
        many = not isinstance(rows, Mapping)
        if many and not rows:
            return self._cursor
        cursor = self._cursor if many else self._raw.cursor()
        # Told to SQLAlchemy's listeners like any statement (counters, tracing; no context).
        self._connection.dispatch.before_cursor_execute(
            self._connection, cursor, sql, rows, None, many
        )
        with self._translated():
            if many:
                cursor.executemany(sql, rows)
            else:
                cursor.execute(sql, rows)
        return cursor

    def sync(self) -> None:
        """Wait for every result queued so far (raises the first error)."""
        with self._translated():
            self._pipeline.sync()

    def commit(self) -> None:
        """Queue ``COMMIT`` behind the writes and wait for everything: one round trip.

        (psycopg's own ``commit`` in pipeline mode would wait twice: once for the commit,
        once more to leave pipeline mode.)
        """
        with self._translated():
            self._cursor.execute("COMMIT")
        self.close()

    def close(self) -> None:
        """Leave pipeline mode, waiting for what is queued (raises the first error)."""
        context, self._context, self._pipeline = self._context, None, None
        if context is not None:
            with self._translated():
                context.__exit__(None, None, None)

    def abandon(self) -> None:
        """Leave pipeline mode after a failure; errors of what was queued are not raised."""
        context, self._context, self._pipeline = self._context, None, None
        if context is not None:
            with contextlib.suppress(Exception):  # rolled back next: its errors are moot
                context.__exit__(None, None, None)
