"""Bulk writes on the raw sqlite3 cursor (``persistence.sqlite_writes``)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    insert,
    select,
)
from sqlalchemy import exc as sa_exc

from foundation.engine import upsert_statement
from persistence.sqlite_writes import SqliteWrites

_METADATA = MetaData()
_ROWS = Table(
    "rows",
    _METADATA,
    Column("key", String, primary_key=True),
    Column("number", Integer),
    Column("blob", LargeBinary),
)


@pytest.fixture
def engine(tmp_path: Any) -> Any:
    """A file SQLite engine with the test table."""
    built = create_engine(f"sqlite:///{tmp_path / 'writes.db'}")
    _METADATA.create_all(built)
    yield built
    built.dispose()


def test_rows_written_in_the_open_transaction_and_rolled_back_with_it(engine: Any) -> None:
    """Rows land through the connection's transaction: a rollback takes them away."""
    statement = insert(_ROWS)
    rows = [{"key": f"k{i}", "number": i, "blob": bytes([i])} for i in range(3)]
    with engine.connect() as connection:
        transaction = connection.begin()
        SqliteWrites(connection).execute_many(statement, rows)
        seen = connection.execute(select(_ROWS.c.key, _ROWS.c.number, _ROWS.c.blob)).all()
        assert sorted(seen) == [("k0", 0, b"\x00"), ("k1", 1, b"\x01"), ("k2", 2, b"\x02")]
        transaction.rollback()
        assert connection.execute(select(_ROWS.c.key)).all() == []


def test_upsert_keeps_the_last_row(engine: Any) -> None:
    """The dialect's upsert runs positionally: the second write of a key replaces the first."""
    statement = upsert_statement("sqlite", _ROWS, "key")
    with engine.begin() as connection:
        writes = SqliteWrites(connection)
        writes.execute_many(statement, [{"key": "a", "number": 1, "blob": None}])
        writes.execute_many(statement, [{"key": "a", "number": 2, "blob": b"x"}])
    with engine.connect() as connection:
        assert connection.execute(select(_ROWS.c.number, _ROWS.c.blob)).all() == [(2, b"x")]


def test_a_duplicate_key_raises_sqlalchemys_integrity_error(engine: Any) -> None:
    """A key written twice is SQLAlchemy's IntegrityError, its sqlite3 error attached."""
    statement = insert(_ROWS)
    with engine.connect() as connection:
        connection.begin()
        writes = SqliteWrites(connection)
        writes.execute_many(statement, [{"key": "a", "number": 1, "blob": None}])
        with pytest.raises(sa_exc.IntegrityError) as raised:
            writes.execute_many(statement, [{"key": "a", "number": 2, "blob": None}])
        assert "UNIQUE" in str(raised.value.orig)


def test_cursor_listeners_see_each_statement_once(engine: Any) -> None:
    """``before_cursor_execute`` hears one executemany per call, with every row's parameters."""
    heard: list[tuple[str, Any, bool]] = []

    def listen(conn: Any, cursor: Any, sql: str, parameters: Any, context: Any, many: bool) -> None:
        heard.append((sql, parameters, many))

    event.listen(engine, "before_cursor_execute", listen)
    with engine.begin() as connection:
        SqliteWrites(connection).execute_many(
            insert(_ROWS),
            [{"key": "a", "number": 1, "blob": None}, {"key": "b", "number": 2, "blob": None}],
        )
    inserts = [entry for entry in heard if entry[0].startswith("INSERT")]
    assert len(inserts) == 1
    sql, parameters, many = inserts[0]
    assert many and sql.count("?") == 3
    assert sorted(parameters) == [("a", 1, None), ("b", 2, None)]


def test_delete_many_removes_exactly_the_ids_given(engine: Any) -> None:
    """Ids beyond SQLite's bound on variables in one statement are deleted, the rest stay."""
    keep = [{"key": f"keep{i}", "number": i, "blob": None} for i in range(5)]
    drop = [{"key": f"drop{i}", "number": i, "blob": None} for i in range(40_000)]
    with engine.begin() as connection:
        SqliteWrites(connection).execute_many(insert(_ROWS), keep + drop)
    with engine.begin() as connection:
        SqliteWrites(connection).delete_many(_ROWS, "key", [row["key"] for row in drop])
    with engine.connect() as connection:
        left = sorted(key for (key,) in connection.execute(select(_ROWS.c.key)))
    assert left == sorted(row["key"] for row in keep)
