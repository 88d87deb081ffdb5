"""One node, one writer, with real processes: a second process refuses; a paused one is fenced.

* Two processes started at once on the same node config: one runs, the other exits with
  status 2 and one line naming the holder.
* The holder is paused (SIGSTOP) past its lease while payments (two ledger effects each on
  Alice, one on Carol) run; a new process takes over and finishes them; the old one is
  resumed (SIGCONT): it commits nothing, exits with status 3, and every effect happened
  exactly once.

Both on SQLite + the SQL queue and on PostgreSQL + RabbitMQ.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from flows.party import Party
from persistence import schema
from persistence.lease_rows import database_now
from tests.conftest import (
    POSTGRES_URL,
    RABBITMQ_URL,
    postgres_problem,
    rabbitmq_problem,
    require_service,
)
from tests.cordapp import PaymentFlow
from tests.process_cluster import Cluster, ClusterNode, check_payments_once
from tests.waiting import serving, still_running, wait_until

LEASE_SECONDS = 2.0


def backends(tmp_path: Path, which: str) -> tuple[str, str | None]:
    """(transport URL, database URL or None for SQLite files) of a backend pair."""
    if which == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}", None
    require_service("PostgreSQL", postgres_problem())
    require_service("RabbitMQ", rabbitmq_problem())
    return RABBITMQ_URL, POSTGRES_URL


def log_of(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.parametrize("which", ["sqlite", "postgresql"])
def test_two_processes_started_at_once_one_runs_the_other_refuses(
    tmp_path: Path, which: str
) -> None:
    transport, database = backends(tmp_path, which)
    cluster = Cluster(tmp_path, transport, database)
    alice = cluster.nodes[0]
    logs = [tmp_path / "alice-1.log", tmp_path / "alice-2.log"]
    processes = [alice.spawn(path) for path in logs]
    try:
        wait_until(lambda: any(p.poll() is not None for p in processes), "one to give up", 90)
        refused = next(i for i, p in enumerate(processes) if p.poll() is not None)
        running = 1 - refused
        assert processes[refused].returncode == 2, log_of(logs[refused])
        wait_until(
            lambda: serving(alice.status_path, processes[running]),
            "the other to start",
            check=still_running(processes[running], logs[running]),
        )
        assert processes[running].poll() is None, log_of(logs[running])
        lines = [line for line in log_of(logs[refused]).splitlines() if "ERROR" in line]
        assert len(lines) == 1, lines
        assert f"the node is already running: pid {processes[running].pid} on host" in lines[0]
        assert " since " in lines[0] and "refusing to start" in lines[0]
        assert "Traceback" not in log_of(logs[refused])
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
        assert all(p.returncode in (0, 2) for p in processes)
        cluster.close()


def lease_expired(node: ClusterNode) -> bool:
    """True once every worker row of the node's database has outlived its lease."""
    engine = node.client.database.engine
    workers = schema.node_workers
    with engine.connect() as connection:
        now = connection.execute(select(database_now(connection))).scalar_one()
        expiries = connection.execute(select(workers.c.expires_at)).scalars().all()
    return bool(expiries) and all(expiry < now for expiry in expiries)


def freeze_outside_a_commit(node: ClusterNode, database: str | None) -> None:
    """SIGSTOP the node's process; on SQLite, at a moment it holds no write lock.

    A SQLite holder frozen inside a transaction keeps that file's write lock until it thaws:
    nothing can take over meanwhile (nothing is lost or done twice either), and on the SQL
    queue's file every node would wait. The test wants the takeover, so it retries the
    freeze until the node database and (on the SQL queue) the queue file are writable.
    """
    assert node.process is not None
    files = [] if database is not None else [node.database_url]
    if node.transport_url.startswith("sqlite:///"):
        files.append(node.transport_url)
    while True:
        node.process.send_signal(signal.SIGSTOP)
        if all(_writable(url.removeprefix("sqlite:///")) for url in files):
            return
        node.process.send_signal(signal.SIGCONT)
        time.sleep(0.05)  # let it finish the transaction it was frozen in


def _writable(path: str) -> bool:
    """True if nobody holds the write lock of the SQLite file at ``path`` now."""
    probe = sqlite3.connect(path, timeout=0.5, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["sqlite", "postgresql"])
def test_a_paused_holder_is_replaced_and_commits_nothing_when_it_thaws(
    tmp_path: Path, which: str
) -> None:
    transport, database = backends(tmp_path, which)
    cluster = Cluster(tmp_path, transport, database, {"lease_seconds": LEASE_SECONDS})
    alice, _, carol = cluster.nodes
    successor: subprocess.Popen[bytes] | None = None
    successor_log = tmp_path / "alice-successor.log"
    try:
        cluster.start()
        payments = [PaymentFlow(Party(carol.name), amount) for amount in range(1, 61)]
        ids = alice.client.start_flows(payments[:40])
        wait_until(lambda: len(alice.client.outcomes(ids)) >= 5, "some payments to finish")
        freeze_outside_a_commit(alice, database)
        wait_until(lambda: lease_expired(alice), "the frozen holder's lease to expire")
        successor = alice.spawn(successor_log)
        wait_until(
            lambda: serving(alice.status_path, successor),
            "the successor to start",
            check=still_running(successor, successor_log),
        )
        assert "took the node over from pid" in log_of(successor_log)
        ids += alice.client.start_flows(payments[40:])
        assert alice.process is not None
        alice.process.send_signal(signal.SIGCONT)  # the old holder thaws
        assert alice.process.wait(60) == 3, log_of(alice.log_path)[-3000:]
        assert "lost the node lease" in log_of(alice.log_path)
        check_payments_once(cluster, payments, ids, wait=180)
        assert successor.poll() is None, log_of(successor_log)[-3000:]
    finally:
        if alice.process is not None and alice.process.poll() is None:
            alice.process.send_signal(signal.SIGCONT)
        if successor is not None and successor.poll() is None:
            successor.send_signal(signal.SIGTERM)
            successor.wait(60)
        cluster.close()
