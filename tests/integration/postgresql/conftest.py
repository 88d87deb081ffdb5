"""``backend`` is PostgreSQL here, and only the tests that use it are run again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import database_for

HERE = Path(__file__).resolve().parent


@pytest.fixture(params=["postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    """The database of the nodes: PostgreSQL, a schema per node (skips without it)."""
    return database_for(str(request.param))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep, of the unit tests collected again here, those that run on a ``backend``."""
    again = [item for item in items if HERE in Path(item.path).resolve().parents]
    dropped = [item for item in again if "backend" not in getattr(item, "fixturenames", ())]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        kept = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in kept]
