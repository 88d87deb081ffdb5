"""Real node processes killed with SIGKILL at seeded-random moments: nothing lost, nothing twice.

Alice, Bob and Carol run as ``fiberflow node run`` processes; 200 flows (ping/pong, trades
with Carol approving, payments with ledger side effects) stream into Alice while a seeded
driver kills a random node and restarts it. Every flow must complete, each exactly once on
every node; also in the peer-to-peer topology (each node its own inbound, bridges between).
Longer runs: ``python -m tests.kill_campaign --kills 100 [--p2p]``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import (
    POSTGRES_URL,
    RABBITMQ_URL,
    postgres_problem,
    rabbitmq_problem,
    require_service,
)
from tests.process_cluster import run_kill_campaign

FLOWS, KILLS = 200, 10


@pytest.mark.slow
def test_sqlite_nodes_on_the_sql_queue_survive_sigkill(tmp_path: Path) -> None:
    report = run_kill_campaign(
        tmp_path, f"sqlite:///{tmp_path / 'queue.db'}", None, FLOWS, KILLS, seed=11
    )
    print(f"{report.kills} SIGKILLs survived {report.kills_by_node}, {report.flows} flows")
    assert report.kills == KILLS


@pytest.mark.slow
def test_postgres_nodes_on_rabbitmq_survive_sigkill(tmp_path: Path) -> None:
    require_service("PostgreSQL", postgres_problem())
    require_service("RabbitMQ", rabbitmq_problem())
    report = run_kill_campaign(tmp_path, RABBITMQ_URL, POSTGRES_URL, FLOWS, KILLS, seed=12)
    print(f"{report.kills} SIGKILLs survived {report.kills_by_node}, {report.flows} flows")
    assert report.kills == KILLS


@pytest.mark.slow
def test_sqlite_nodes_each_on_its_own_inbound_survive_sigkill(tmp_path: Path) -> None:
    """The peer-to-peer topology: bridges deliver, a killed node's bridges resume."""
    report = run_kill_campaign(tmp_path, "", None, FLOWS, KILLS, seed=13, p2p=True)
    print(f"{report.kills} SIGKILLs survived {report.kills_by_node}, {report.flows} flows")
    assert report.kills == KILLS
