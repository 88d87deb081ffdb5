"""Does a flow cost the same with 100,000 flows in flight as with 1,000? (issue 14, goal 5)

Alice and Bob run ping/pong in one process (``MockNetwork``). The same number of flows
(``--total``, 100,000 by default) is run several times, each time with a different number
in flight at once (``--in-flight``: 1,000, 10,000, 100,000): a wave of that many flows is
started in one transaction and the network runs until the wave is done, then the next wave.
With 100,000 in flight every flow's state, fiber and messages are live at the same moment.

For each it prints the CPU seconds per flow (process time: what the node does, whatever else
the machine runs), the part of it spent in Python's cyclic garbage collector, wall flows/s,
and the resident memory after the run; then the ratio of CPU per flow at the largest
in-flight count to the smallest (goal 5: at most 1.2).

The collector is tuned as a node process tunes it (:func:`flows.process.gc_tuning.tune_collector`).

Run: ``python benchmarks/scaling.py [--total 100000] [--in-flight 1000 10000 100000]
[--database memory|sqlite]``.
"""

from __future__ import annotations

import argparse
import gc
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sessions import GcTimer
from flows.process.gc_tuning import tune_collector
from flows.testing import MockNetwork
from samples.pingpong import PingFlow

START_BATCH = 1000
"""Flows started per ``start_flows`` call (one transaction each) while filling a wave."""


def run(total: int, in_flight: int, database: str) -> dict[str, float]:
    """Run ``total`` ping/pongs, ``in_flight`` at a time; return the figures."""
    with tempfile.TemporaryDirectory() as directory:
        net = MockNetwork(
            cordapps=["samples.pingpong"],
            directory=directory,
            database=database,
            synchronous="NORMAL",
        )
        try:
            alice = net.create_node("O=Alice,L=London,C=GB")
            bob = net.create_node("O=Bob,L=New York,C=US")
            warm = alice.start_flows([PingFlow(bob.party) for _ in range(100)])
            net.run_network()
            assert all(handle.result() == "Pong" for handle in warm)
            gc.collect()
            done = 0
            checked = []
            with GcTimer() as collector:
                cpu, wall = time.process_time(), time.perf_counter()
                while done < total:
                    wave = min(in_flight, total - done)
                    started = 0
                    while started < wave:
                        count = min(START_BATCH, wave - started)
                        handles = alice.start_flows([PingFlow(bob.party) for _ in range(count)])
                        checked.append(handles[0])
                        started += count
                    net.run_network()
                    done += wave
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            assert all(handle.result() == "Pong" for handle in checked)
            assert not alice.node.manager.live_flows() and not bob.node.manager.live_flows()
        finally:
            net.stop_nodes()
    return {
        "cpu us/flow": 1e6 * cpu / total,
        "gc us/flow": 1e6 * collector.seconds / total,
        "flows/s": total / wall,
        "peak MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    """Run each in-flight count; print a table and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--total", type=int, default=100_000)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--database", choices=["memory", "sqlite"], default="memory")
    args = parser.parse_args()
    tune_collector()
    print(f"{args.total:,} ping/pongs per row on {args.database}, one process (MockNetwork)")
    print(
        f"{'in flight':>10} {'cpu us/flow':>12} {'gc us/flow':>11} {'flows/s':>9} {'peak MiB':>9}"
    )
    rows = {}
    for in_flight in sorted(args.in_flight):
        row = rows[in_flight] = run(args.total, in_flight, args.database)
        print(
            f"{in_flight:>10,} {row['cpu us/flow']:>12.0f} {row['gc us/flow']:>11.0f} "
            f"{row['flows/s']:>9,.0f} {row['peak MiB']:>9,.0f}"
        )
        sys.stdout.flush()
    low, high = min(rows), max(rows)
    ratio = rows[high]["cpu us/flow"] / rows[low]["cpu us/flow"]
    verdict = "met" if ratio <= 1.2 else "not yet"
    print(
        f"goal 5: CPU per flow at {high:,} in flight is {ratio:.2f}x that at {low:,} "
        f"(at most 1.2: {verdict}); peak memory is the process's high-water mark so far"
    )


if __name__ == "__main__":
    main()
