"""The store conformance suite on the node database: SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from foundation.engine import drop_schema
from persistence import schema
from persistence.store import NodeDatabase
from tests.conftest import POSTGRES_URL, postgres_problem, require_service
from tests.store_conformance import Store, StoreConformance


class SqlStoreHarness:
    """Opens node databases on one URL (and PostgreSQL schema), with a MAC key."""

    duplicate_id_error = IntegrityError

    def __init__(self, url: str, schema_name: str | None = None) -> None:
        self.url = url
        self.schema_name = schema_name
        self.opened: list[NodeDatabase] = []

    def open(self) -> Store:
        database = NodeDatabase(
            self.url, synchronous="NORMAL", schema_name=self.schema_name, mac_key=b"k" * 32
        )
        self.opened.append(database)
        return database

    def dead_letters(self, store: Store) -> list[tuple[str, str, str, bytes]]:
        assert isinstance(store, NodeDatabase)
        table = schema.node_dead_letters
        query = select(table.c.message_id, table.c.sender, table.c.reason, table.c.payload)
        with store.engine.connect() as connection:
            return [tuple(row) for row in connection.execute(query.order_by(table.c.id))]

    def close(self) -> None:
        for database in self.opened:
            database.close()


class TestNodeDatabaseOnSqlite(StoreConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[SqlStoreHarness]:
        harness = SqlStoreHarness(f"sqlite:///{tmp_path / 'node.db'}")
        yield harness
        harness.close()


class TestNodeDatabaseOnPostgres(StoreConformance):
    @pytest.fixture
    def harness(self) -> Iterator[SqlStoreHarness]:
        require_service("PostgreSQL", postgres_problem())
        harness = SqlStoreHarness(POSTGRES_URL, f"ffstore_{uuid.uuid4().hex[:10]}")
        yield harness
        harness.close()
        assert harness.schema_name is not None
        drop_schema(POSTGRES_URL, harness.schema_name)
