"""How many flows a node finished over the last minute, from its finished tables' times."""

from __future__ import annotations

import time

import attrs
from sqlalchemy import func, select

from persistence import schema
from persistence.store import NodeDatabase

WINDOW_SECONDS = 60
"""The window the console's throughput covers."""


@attrs.frozen
class Throughput:
    """Flows finished in the last :data:`WINDOW_SECONDS`, and their rate."""

    completed: int
    """Completed flows whose result the node kept (flows started through a request)."""
    failed: int
    """Failed flows (the node keeps every one)."""
    window_seconds: int = WINDOW_SECONDS

    @property
    def per_second(self) -> float:
        """Completed and failed flows per second over the window."""
        return (self.completed + self.failed) / self.window_seconds


def recent_throughput(database: NodeDatabase, now: float | None = None) -> Throughput:
    """Count the rows of ``node_flow_results`` and ``node_flow_exceptions`` of the last minute."""
    since = int(((time.time() if now is None else now) - WINDOW_SECONDS) * 1000)
    results, failures = schema.node_flow_results, schema.node_flow_exceptions
    with database.engine.connect() as connection:
        completed = connection.execute(
            select(func.count()).select_from(results).where(results.c.completed_at >= since)
        ).scalar_one()
        failed = connection.execute(
            select(func.count()).select_from(failures).where(failures.c.failed_at >= since)
        ).scalar_one()
    return Throughput(int(completed), int(failed))
