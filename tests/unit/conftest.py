"""The unit tier runs its network tests on SQLite (the integration tier, on PostgreSQL)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    """The database of the nodes: SQLite, a file per node (no service needed)."""
    return str(request.param)
