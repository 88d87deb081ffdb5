"""One node run by 1, 2 and 3 worker processes: ping/pong throughput and failover time.

Alice and Bob each run as N worker processes (``fiberflow node run --worker``), their node
databases on PostgreSQL and the transport RabbitMQ (``--transport`` for the SQL queue on
PostgreSQL instead). Two measurements:

* ``throughput``: for N = 1, 2, 3 in one run, F ping/pong flows requested in one transaction,
  timed from that commit to the last outcome; flows/s and the ratio to N = 1. Goal on this
  2-core machine: 2 workers at least 1.6 times one.
* ``failover``: Alice by 2 workers; one is stopped, then ping/pongs are requested whose flow
  ids fall in its partitions, and the time from the stop until the first of them completes
  is printed. With SIGKILL a worker on the same host is seen dead at once (its process is
  gone); with SIGSTOP it looks like a worker on another host that went silent, and only its
  lease's expiry frees its partitions. Goal: at most the lease + 2 s.

Run: ``python benchmarks/workers.py [--flows 3000] [--workers 1 2 3] [--lease 5]
[--parts throughput failover] [--transport URL]``. Prints progress as it goes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flows.party import Party
from samples.pingpong import PingFlow
from statemachine.partitions import PARTITIONS, partition_of
from tests.process_cluster import Cluster, Worker, settled
from tests.waiting import wait_until

POSTGRES_URL = os.environ.get(
    "FIBERFLOW_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
RABBITMQ_URL = os.environ.get(
    "FIBERFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"
)


class Pair:
    """Alice and Bob, each run by ``count`` workers, in a cluster of their own."""

    def __init__(self, directory: Path, transport: str, count: int, lease: float) -> None:
        self.cluster = Cluster(directory, transport, POSTGRES_URL, {"lease_seconds": lease})
        alice, bob, _ = self.cluster.nodes
        self.alice, self.bob = alice, bob
        names = [f"w{i + 1}" for i in range(count)]
        self.alice_workers = [Worker(alice, name, directory) for name in names]
        self.bob_workers = [Worker(bob, name, directory) for name in names]

    def start(self) -> None:
        every = self.alice_workers + self.bob_workers
        for worker in every:
            worker.start()
        for worker in every:
            worker.wait_serving()
        for workers in (self.alice_workers, self.bob_workers):
            wait_until(_settled_check(workers), "the workers to split the partitions", 60)

    def close(self) -> None:
        for worker in self.alice_workers + self.bob_workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
            worker.stop()
        self.cluster.close()

    def pings(self, count: int, ids: list[str] | None = None) -> list[str]:
        flows = [PingFlow(Party(self.bob.name)) for _ in range(count)]
        return self.alice.client.start_flows(flows, request_ids=ids)

    def wait_all(self, ids: list[str], timeout: float = 600) -> float:
        """Seconds until every one of ``ids`` has an outcome (from now)."""
        began = time.perf_counter()
        deadline = time.monotonic() + timeout
        while len(self.alice.client.outcomes(ids)) < len(ids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(ids)} flows did not finish in {timeout} s")
            time.sleep(0.05)
        return time.perf_counter() - began


def _settled_check(workers: list[Worker]) -> Callable[[], bool]:
    return lambda: settled(workers)


def cpu_times() -> tuple[float, float]:
    """(busy, total) seconds of every CPU of the machine so far (``/proc/stat``)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / ticks, sum(fields) / ticks


def cpu_by_program() -> dict[str, float]:
    """CPU seconds (user + system) used so far by the live processes of each program.

    ``postgres`` (every backend), ``beam.smp`` (RabbitMQ) and ``python`` (node processes and
    this driver), from ``/proc/<pid>/stat``. Processes that ended are not counted.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        program = "python" if name.startswith("python") else name
        found[program] = found.get(program, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return found


def throughput(transport: str, counts: list[int], flows: int, lease: float) -> None:
    print(f"ping/pong throughput, Alice and Bob each run by N workers ({flows} flows a run)")
    print(
        f"on {os.cpu_count()} CPUs; 'busy' is the share of the machine's CPU time spent during the "
        "timed part (every process: nodes, PostgreSQL, RabbitMQ)"
    )
    print(
        f"{'workers':>8} {'flows/s':>9} {'vs 1':>6} {'busy':>6} {'CPU ms/flow':>12} "
        f"{'nodes':>6} {'postgres':>9} {'rabbitmq':>9}"
    )
    baseline: float | None = None
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="fiberflow-workers-") as directory:
            pair = Pair(Path(directory), transport, count, lease)
            try:
                pair.start()
                pair.wait_all(pair.pings(min(200, flows)))  # warm up every worker
                busy_before, total_before = cpu_times()
                programs_before = cpu_by_program()
                began = time.perf_counter()
                ids = pair.pings(flows)
                pair.wait_all(ids)
                rate = flows / (time.perf_counter() - began)
                busy_after, total_after = cpu_times()
                programs_after = cpu_by_program()
            finally:
                pair.close()
        baseline = baseline or (rate if count == 1 else None)
        ratio = f"{rate / baseline:.2f}x" if baseline else "-"
        busy = (busy_after - busy_before) / (total_after - total_before)
        per_flow = (busy_after - busy_before) / flows * 1000
        shares = {
            name: (programs_after.get(name, 0.0) - programs_before.get(name, 0.0)) / flows * 1000
            for name in ("python", "postgres", "beam.smp")
        }
        print(
            f"{count:>8} {rate:>9,.0f} {ratio:>6} {busy:>6.0%} {per_flow:>12.2f} "
            f"{shares['python']:>6.2f} {shares['postgres']:>9.2f} {shares['beam.smp']:>9.2f}",
            flush=True,
        )
    print(
        "goal: 2 workers at least 1.6x one. More workers only help while the machine has idle "
        "CPU: at 'busy' near 100% the ceiling is the machine's CPUs over the CPU ms per flow. "
        "nodes / postgres / rabbitmq: CPU ms per flow of each program (live processes only)"
    )


def ids_in(partitions: list[int], count: int) -> list[str]:
    found: list[str] = []
    while len(found) < count:
        flow_id = uuid.uuid4().hex
        if partition_of(flow_id) in partitions:
            found.append(flow_id)
    return found


def failover(transport: str, lease: float) -> None:
    print(f"failover: Alice by 2 workers, lease {lease:g} s; time from the stop of one until a")
    print("new ping/pong in its partitions completes")
    for how in ("SIGKILL", "SIGSTOP"):
        with tempfile.TemporaryDirectory(prefix="fiberflow-failover-") as directory:
            pair = Pair(Path(directory), transport, 2, lease)
            pair.bob_workers = pair.bob_workers[:1]
            try:
                pair.start()
                victim, survivor = pair.alice_workers
                theirs = victim.partitions() or []
                pair.wait_all(pair.pings(20))
                assert victim.process is not None
                stopped = time.perf_counter()
                victim.process.send_signal(getattr(signal, how))
                ids = pair.pings(5, ids_in(theirs, 5))
                while not pair.alice.client.outcomes(ids):
                    time.sleep(0.01)
                served = time.perf_counter() - stopped
                deadline = time.monotonic() + 5  # (its status file is written every second)
                while survivor.partitions() != list(range(PARTITIONS)):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                taken = survivor.partitions() == list(range(PARTITIONS))
            finally:
                pair.close()
        bound = 2.0 if how == "SIGKILL" else lease + 2.0
        note = "dead process seen at once" if how == "SIGKILL" else "only the lease tells"
        print(
            f"  {how}: served again after {served:.2f} s (goal <= {bound:g} s; {note}); "
            f"survivor holds all 16: {taken}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, default=3000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--lease", type=float, default=5.0, help="lease seconds (failover)")
    parser.add_argument("--parts", nargs="+", default=["throughput", "failover"])
    parser.add_argument("--transport", default=RABBITMQ_URL)
    args = parser.parse_args()
    if "throughput" in args.parts:
        throughput(args.transport, args.workers, args.flows, args.lease)
    if "failover" in args.parts:
        failover(args.transport, args.lease)
    return 0


if __name__ == "__main__":
    sys.exit(main())
