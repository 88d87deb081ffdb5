"""Assertions shared by the network tests."""

from __future__ import annotations

from sqlalchemy import select

from flows.testing import MockNetwork, MockNode
from persistence import schema


def assert_drained(net: MockNetwork, keep_checkpoints: bool = False) -> None:
    """Nothing left anywhere: no checkpoint, no outbox row, no message queued or in flight."""
    for node in net.nodes:
        if not keep_checkpoints:
            assert node.checkpoints() == [], f"{node.name} kept checkpoints"
        assert node.node.database.count("node_outbox") == 0, f"{node.name} has outbox rows"
        assert net.messaging.pending(node.name) == 0, f"messages still queued for {node.name}"
        assert net.messaging.in_flight(node.name) == 0, f"unacknowledged at {node.name}"
        assert node.node.manager.parked_message_count() == 0


def restore_now(node: MockNode) -> int:
    """Restore every dormant flow of ``node`` now (flows are restored lazily after a start).

    Their replays run in the next rounds; returns how many were restored.
    """
    return node.node.manager.dormancy.restore_all()


def results_by_class(node: MockNode) -> dict[str, int]:
    """How many stored results each flow class has on ``node``."""
    table = schema.node_flow_results
    with node.node.database.engine.connect() as connection:
        rows = connection.execute(select(table.c.flow_class)).scalars().all()
    counts: dict[str, int] = {}
    for name in rows:
        short = name.rsplit(".", 1)[-1]
        counts[short] = counts.get(short, 0) + 1
    return counts


def stored_results(node: MockNode, flow_class: str) -> list[bytes]:
    """The serialized results of ``flow_class`` (short name) on ``node``."""
    table = schema.node_flow_results
    with node.node.database.engine.connect() as connection:
        rows = connection.execute(select(table.c.flow_class, table.c.result)).all()
    return [r.result for r in rows if r.flow_class.rsplit(".", 1)[-1] == flow_class]
