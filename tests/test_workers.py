"""One node run by several worker processes on PostgreSQL: shares, hand-overs and takeovers.

Real ``fiberflow node run --worker NAME`` processes. Alice is run by two workers; Bob and
Carol by one process each. The node databases are on PostgreSQL (each node in a schema of its
own); the transport is the SQL queue on PostgreSQL or RabbitMQ. Every flow must complete
exactly once and every ledger effect must happen once, counted from the databases.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from flows import FOREVER
from flows.client import decode_outcome
from flows.operator import list_flows, process_reports
from flows.party import Party
from flows.runtime_config import load_config
from persistence import schema
from samples.pingpong import PingFlow
from statemachine.partitions import PARTITIONS, partition_of, partition_ranges
from tests.conftest import (
    POSTGRES_URL,
    RABBITMQ_URL,
    postgres_problem,
    rabbitmq_problem,
    require_service,
)
from tests.cordapp import PatientFlow, PaymentFlow
from tests.process_cluster import Cluster, ClusterNode, check_payments_once, stop_process
from tests.waiting import serving, still_running, wait_until

LEASE_SECONDS = 3.0


@attrs.define
class Worker:
    """One worker process of a node."""

    node: ClusterNode
    name: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.node.short}-{self.name}.log"

    @property
    def status_path(self) -> Path:
        return self.node.worker_status_path(self.name)

    def start(self) -> None:
        self.process = self.node.spawn(self.log_path, worker=self.name)

    def wait_serving(self) -> None:
        process = self.process
        assert process is not None
        wait_until(
            lambda: serving(self.status_path, process),
            f"worker {self.name} to start",
            90,
            check=still_running(process, self.log_path),
        )

    def partitions(self) -> list[int] | None:
        try:
            status: dict[str, Any] = json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return None
        if self.process is None or status.get("pid") != self.process.pid:
            return None
        found = status.get("partitions")
        return None if found is None else list(found)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        return stop_process(self.process)


@pytest.fixture(params=["sqlqueue", "rabbitmq"])
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    require_service("PostgreSQL", postgres_problem())
    transport = POSTGRES_URL
    if request.param == "rabbitmq":
        require_service("RabbitMQ", rabbitmq_problem())
        transport = RABBITMQ_URL
    made = Cluster(tmp_path, transport, POSTGRES_URL, {"lease_seconds": LEASE_SECONDS})
    yield made
    made.close()


def settled(workers: list[Worker]) -> bool:
    """True once the running workers' status files show a fair split of every partition."""
    shares = [w.partitions() for w in workers]
    if any(share is None for share in shares):
        return False
    held = [p for share in shares for p in share or []]
    sizes = [len(share or []) for share in shares]
    return sorted(held) == list(range(PARTITIONS)) and max(sizes) - min(sizes) <= 1


def reported_live(reports: list[str]) -> list[int]:
    """The live flows the workers' report lines add up to (one item), or [] if not two."""
    counts = [re.search(r"ago\): (\d+) live", line) for line in reports]
    if len(counts) != 2 or not all(counts):
        return []
    return [sum(int(found.group(1)) for found in counts if found)]


def start_with_workers(cluster: Cluster, workers: list[Worker]) -> None:
    """Start Bob and Carol, then Alice's workers; wait until they split the partitions."""
    for node in cluster.nodes[1:]:
        node.start()
    for node in cluster.nodes[1:]:
        node.wait_started()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.wait_serving()
    wait_until(lambda: settled(workers), "the workers to split the partitions", 60)


def test_two_workers_split_the_partitions_and_serve_ping_pong_and_payments_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    alice, bob, carol = cluster.nodes
    workers = [Worker(alice, name, tmp_path) for name in ("w1", "w2")]
    try:
        start_with_workers(cluster, workers)
        pings = [PingFlow(Party(bob.name)) for _ in range(30)]
        payments = [PaymentFlow(Party(carol.name), amount) for amount in range(1, 31)]
        ping_ids = alice.client.start_flows(pings)
        payment_ids = alice.client.start_flows(payments)
        outcomes = alice.client.wait(ping_ids + payment_ids, timeout=180)
        assert [decode_outcome(outcomes[i]) for i in ping_ids] == ["Pong"] * len(pings)
        assert [decode_outcome(outcomes[i]) for i in payment_ids] == [
            f"receipt {p.amount}" for p in payments
        ]
        check_payments_once(cluster, payments, payment_ids)
        assert bob.counts(schema.node_flow_results)["PongFlow"] == 30
        for worker in workers:  # both ran some of the flows
            assert "requested flow(s)" in worker.log(), worker.log()[-3000:]
            assert worker.process is not None and worker.process.poll() is None
        # flow list names the worker of each flow and each worker's report.
        waiting = alice.client.start_flows([PatientFlow(Party(bob.name), FOREVER, False)] * 8)
        config = load_config(alice.config_path)
        wait_until(
            lambda: sum(f["status"] == "SUSPENDED" for f in list_flows(config)) == 8,
            "the waiting flows to suspend",
            60,
        )
        owners = {f["flow_id"]: f["worker"] for f in list_flows(config)}
        shares = {w.name: set(w.partitions() or []) for w in workers}
        assert {flow_id: owners[flow_id] for flow_id in waiting} == {
            flow_id: next(n for n, ps in shares.items() if partition_of(flow_id) in ps)
            for flow_id in waiting
        }
        wait_until(
            lambda: (
                sum("8 live" in line or "live" in line for line in process_reports(config)) == 2
                and sum(
                    int(line.split(" live")[0].rsplit(" ", 1)[-1])
                    for line in process_reports(config)
                )
                == 8
            ),
            "both workers to report their live flows",
            30,
        )
        reports = process_reports(config)
        for worker in workers:
            assert any(
                f"worker {worker.name!r} (pid {worker.process.pid}" in line
                and partition_ranges(worker.partitions() or []) in line
                for line in reports
            ), reports
    finally:
        for worker in workers:
            assert worker.stop() in (0, None), worker.log()[-3000:]


def test_a_killed_worker_s_partitions_are_taken_over_and_every_flow_finishes_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    alice, _, carol = cluster.nodes
    workers = [Worker(alice, name, tmp_path) for name in ("w1", "w2")]
    try:
        start_with_workers(cluster, workers)
        payments = [PaymentFlow(Party(carol.name), amount) for amount in range(1, 61)]
        ids = alice.client.start_flows(payments[:40])
        wait_until(lambda: len(alice.client.outcomes(ids)) >= 5, "some payments to finish")
        victim, survivor = workers
        assert victim.process is not None
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(30)
        ids += alice.client.start_flows(payments[40:])
        wait_until(
            lambda: survivor.partitions() == list(range(PARTITIONS)),
            "the survivor to take every partition",
            60,
            check=still_running(survivor.process, survivor.log_path),  # type: ignore[arg-type]
        )
        outcomes = alice.client.wait(ids, timeout=180)
        assert [decode_outcome(outcomes[i]) for i in ids] == [
            f"receipt {p.amount}" for p in payments
        ]
        check_payments_once(cluster, payments, ids)
        assert "took partitions of the node over from" in survivor.log()
        # The killed worker comes back: it joins again and gets its share back.
        victim.start()
        victim.wait_serving()
        wait_until(lambda: settled(workers), "the restarted worker to get its share", 60)
    finally:
        for worker in workers:
            worker.stop()


def test_a_worker_is_refused_on_a_sqlite_node_saying_why(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, f"sqlite:///{tmp_path / 'queue.db'}", None)
    alice = cluster.nodes[0]
    worker = Worker(alice, "w1", tmp_path)
    try:
        worker.start()
        assert worker.process is not None
        assert worker.process.wait(90) == 2, worker.log()[-3000:]
        errors = [line for line in worker.log().splitlines() if "ERROR" in line]
        assert len(errors) == 1, errors
        assert "a node on SQLite runs as one process" in errors[0]
        assert "need the node database on PostgreSQL" in errors[0]
        assert "Traceback" not in worker.log()
    finally:
        worker.stop()
        cluster.close()


def test_a_second_worker_of_the_same_name_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    alice = cluster.nodes[0]
    first = Worker(alice, "w1", tmp_path)
    twin = Worker(alice, "w1", tmp_path / "twin")
    twin.directory.mkdir()
    try:
        first.start()
        first.wait_serving()
        twin.start()
        assert twin.process is not None
        assert twin.process.wait(90) == 2, twin.log()[-3000:]
        assert "worker 'w1' of the node is already running" in twin.log()
        assert first.process is not None and first.process.poll() is None
    finally:
        first.stop()
        twin.stop()
