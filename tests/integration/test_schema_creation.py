"""Several processes creating the same node database at once (two workers of a node start
together): every one of them opens it, none fails or retries, none leaks a connection."""

from __future__ import annotations

import threading
import uuid

import pytest

from foundation.engine import drop_schema
from persistence.store import NodeDatabase
from tests.conftest import POSTGRES_URL, postgres_problem, require_service

OPENERS = 6


@pytest.mark.parametrize("round_", range(3))
def test_workers_creating_one_node_schema_at_the_same_moment_all_open_it(round_: int) -> None:
    require_service("PostgreSQL", postgres_problem())
    schema_name = f"ff_race_{uuid.uuid4().hex[:8]}"
    start = threading.Barrier(OPENERS)
    opened: list[NodeDatabase] = []
    errors: list[BaseException] = []

    def open_it() -> None:
        start.wait()
        try:
            opened.append(NodeDatabase(POSTGRES_URL, schema_name=schema_name))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=open_it) for _ in range(OPENERS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert len(opened) == OPENERS
        assert {db.count("node_schema_version") for db in opened} == {1}
    finally:
        for db in opened:
            db.close()
        drop_schema(POSTGRES_URL, schema_name)
