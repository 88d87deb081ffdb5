"""One node run by several worker processes on PostgreSQL: shares, hand-overs and takeovers.

Real ``fiberflow node run --worker NAME`` processes. Alice is run by two workers; Bob and
Carol by one process each. The node databases are on PostgreSQL (each node in a schema of its
own); the transport is the SQL queue on PostgreSQL or RabbitMQ. Every flow must complete
exactly once and every ledger effect must happen once, counted from the databases.
"""

from __future__ import annotations

import re
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows import FOREVER
from flows.config.runtime import load_config
from flows.node.client import decode_outcome
from flows.node.inspection import list_flows, process_reports
from flows.party import Party
from flows.process.command import run_node, worker_name_problem
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
from tests.process_cluster import (
    Cluster,
    Worker,
    check_payments_once,
    run_worker_campaign,
    settled,
)
from tests.waiting import still_running, wait_until

LEASE_SECONDS = 3.0


@pytest.fixture(params=["sqlqueue", "rabbitmq"])
def transport(request: pytest.FixtureRequest) -> str:
    """The SQL queue on PostgreSQL, or RabbitMQ (the node databases are on PostgreSQL)."""
    require_service("PostgreSQL", postgres_problem())
    if request.param == "rabbitmq":
        require_service("RabbitMQ", rabbitmq_problem())
        return RABBITMQ_URL
    return POSTGRES_URL


@pytest.fixture
def cluster(tmp_path: Path, transport: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, transport, POSTGRES_URL, {"lease_seconds": LEASE_SECONDS})
    yield made
    made.close()


def reported_live(reports: list[str]) -> list[int]:
    """The live flows the workers' report lines add up to (one item), or [] if not two."""
    counts = [re.search(r"ago\): (\d+) live", line) for line in reports]
    if len(counts) != 2 or not all(counts):
        return []
    return [sum(int(found.group(1)) for found in counts if found)]


def start_paying(
    cluster: Cluster, count: int, now: int | None = None
) -> tuple[list[PaymentFlow], list[str]]:
    """Payments of 1 to ``count`` from Alice to Carol; the first ``now`` of them (all by
    default) are requested, and the first few have finished when it returns."""
    alice, _, carol = cluster.nodes
    payments = [PaymentFlow(Party(carol.name), amount) for amount in range(1, count + 1)]
    ids = alice.client.start_flows(payments[:now])
    wait_until(lambda: len(alice.client.outcomes(ids)) >= 3, "some payments to finish")
    return payments, ids


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
        check_payments_once(cluster, payments, ids, wait=180)
        assert "took partitions of the node over from" in survivor.log()
        # The killed worker comes back: it joins again and gets its share back.
        victim.start()
        victim.wait_serving()
        wait_until(lambda: settled(workers), "the restarted worker to get its share", 60)
    finally:
        for worker in workers:
            worker.stop()


def test_a_worker_frozen_past_its_lease_is_taken_over_and_commits_nothing_when_it_thaws(
    cluster: Cluster, tmp_path: Path
) -> None:
    alice = cluster.nodes[0]
    workers = [Worker(alice, name, tmp_path) for name in ("w1", "w2")]
    frozen, survivor = workers
    try:
        start_with_workers(cluster, workers)
        payments, ids = start_paying(cluster, 40, now=30)
        assert frozen.process is not None
        frozen.process.send_signal(signal.SIGSTOP)
        wait_until(
            lambda: survivor.partitions() == list(range(PARTITIONS)),
            "the survivor to take the frozen worker's partitions once its lease expired",
            60,
        )
        ids += alice.client.start_flows(payments[30:])
        frozen.process.send_signal(signal.SIGCONT)  # it thaws holding stale epochs
        assert frozen.process.wait(60) == 3, frozen.log()[-3000:]
        assert "lost the node lease" in frozen.log()
        check_payments_once(cluster, payments, ids, wait=180)
    finally:
        if frozen.process is not None and frozen.process.poll() is None:
            frozen.process.send_signal(signal.SIGCONT)
        for worker in workers:
            worker.stop()


def test_a_worker_drained_with_sigterm_hands_its_partitions_over_failing_no_flow(
    cluster: Cluster, tmp_path: Path
) -> None:
    alice = cluster.nodes[0]
    workers = [Worker(alice, name, tmp_path) for name in ("w1", "w2")]
    leaving, staying = workers
    try:
        start_with_workers(cluster, workers)
        payments, ids = start_paying(cluster, 40)
        assert leaving.stop() == 0, leaving.log()[-3000:]  # SIGTERM: a clean stop
        assert "stopped cleanly" in leaving.log()
        wait_until(
            lambda: staying.partitions() == list(range(PARTITIONS)),
            "the staying worker to take every partition",
            30,
        )
        check_payments_once(cluster, payments, ids, wait=180)
        assert alice.counts(schema.node_flow_exceptions) == Counter()
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


def test_a_short_campaign_of_kills_and_stops_against_three_workers(
    transport: str, tmp_path: Path
) -> None:
    """The CI run of ``python -m tests.kill_campaign --workers 3`` (which makes 100 and more)."""
    report = run_worker_campaign(
        tmp_path,
        transport,
        POSTGRES_URL,
        flows=45,
        disruptions=6,
        seed=20261124,
        workers=3,
    )
    assert report.kills + report.stops == 6


def test_a_bad_worker_name_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert worker_name_problem("w1") is None and worker_name_problem("eu-west.2_a") is None
    assert "1 to 64 characters" in (worker_name_problem("") or "")
    assert "1 to 64 characters" in (worker_name_problem("w" * 65) or "")
    assert "letters, digits" in (worker_name_problem("w 1") or "")
    config = tmp_path / "node.toml"
    config.write_text('name = "O=Alice,L=London,C=GB"\n')
    assert run_node(config, worker="no spaces please") == 2
    assert "--worker: 'no spaces please': a worker's name has letters" in capsys.readouterr().err
