"""Ping/pong in one process, in steady state, against the bounds measured in the same run.

Alice and Bob run in one process on the in-memory transport (``MockNetwork``); flows are
started continuously (a wave of ``--wave`` flows, in one transaction, whenever fewer than that
are in flight) while the network runs, so the figure is a steady state, not a burst. For each
configuration it prints:

* flows/s (completed ping/pongs over the whole run) and latency p50/p99 (start to result);
* commits and SQL statements per flow (both nodes together; durable configurations only);
* one flow at a time on SQLite FULL: its latency and commits (issue 14's latency goal);
* the ratio to the bound that issue 14's goal names, measured in this run
  (:mod:`benchmarks.bounds`): the bare greenlet + msgpack hub for checkpoints off, the raw
  sqlite3 batched-commit rate for SQLite ``synchronous=FULL``.

The garbage collector is tuned first, as a node process tunes it once started
(:func:`flows.process.gc_tuning.tune_collector`), for the bounds and fiberflow alike.

Configurations: ``off`` (the non-durable in-memory store), ``full`` (SQLite, WAL,
synchronous=FULL), ``normal`` (synchronous=NORMAL). Run:
``python benchmarks/pingpong.py [--flows 2000] [--wave 100] [--configs off full normal]
[--metrics]``; ``--metrics`` runs both nodes with Prometheus metrics on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import event

from benchmarks.bounds import greenlet_pairs_per_second, sqlite_groups_per_second
from flows.node.handles import FlowHandle
from flows.process.gc_tuning import tune_collector
from flows.testing import MockNetwork
from samples.pingpong import PingFlow
from statemachine.flow_end import FlowEnd

CONFIGS: dict[str, tuple[str, str]] = {
    "off": ("memory", "NORMAL"),
    "full": ("sqlite", "FULL"),
    "normal": ("sqlite", "NORMAL"),
}
GOALS = {
    "off": ("in memory: >= 40% of the greenlet bound", 0.40),
    "full": ("SQLite FULL: >= 12% of the raw batched-commit rate (>= 2,500 flows/s)", 0.12),
}


def run(config: str, flows: int, wave: int, metrics: bool = False) -> dict[str, Any]:
    """Run ``flows`` ping/pongs in steady state on ``config``; the figures.

    With ``metrics`` each node feeds Prometheus metrics (:mod:`flows.metrics`), as a node
    process with a ``[metrics]`` section does.
    """
    database, synchronous = CONFIGS[config]
    with tempfile.TemporaryDirectory() as directory:
        net = MockNetwork(
            cordapps=["samples.pingpong"],
            directory=directory,
            database=database,
            synchronous=synchronous,
        )
        try:
            if metrics:
                from flows.metrics import NodeMetrics

                alice = net.create_node("O=Alice,L=London,C=GB", metrics=NodeMetrics())
                bob = net.create_node("O=Bob,L=New York,C=US", metrics=NodeMetrics())
            else:
                alice = net.create_node("O=Alice,L=London,C=GB")
                bob = net.create_node("O=Bob,L=New York,C=US")
            counts = {"commits": 0, "statements": 0}
            for mock in (alice, bob):
                engine = getattr(mock.node.database, "engine", None)
                if engine is not None:
                    _count(engine, counts)
            started_at: dict[str, float] = {}
            latencies: list[float] = []

            def ended(end: FlowEnd) -> None:
                began = started_at.pop(end.flow_id, None)
                if began is not None:
                    latencies.append(time.perf_counter() - began)

            alice.node.add_end_listener(ended)
            handles: list[FlowHandle[str]] = []
            began = time.perf_counter()
            while len(handles) < flows or started_at:
                if len(started_at) < wave and len(handles) < flows:
                    batch = alice.start_flows(
                        [PingFlow(bob.party) for _ in range(min(wave, flows - len(handles)))]
                    )
                    now = time.perf_counter()
                    for handle in batch:
                        started_at[handle.flow_id] = now
                    handles += batch
                if not net.run_once() and started_at:
                    net.run_network()
            elapsed = time.perf_counter() - began
            assert all(h.result() == "Pong" for h in handles)
        finally:
            net.stop_nodes()
    latencies.sort()
    return {
        "flows/s": flows / elapsed,
        "p50 ms": 1000 * statistics.median(latencies),
        "p99 ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "commits/flow": counts["commits"] / flows if database != "memory" else None,
        "statements/flow": counts["statements"] / flows if database != "memory" else None,
    }


def _count(engine: Any, counts: dict[str, int]) -> None:
    """Count the commits and statements ``engine`` runs into ``counts``."""

    @event.listens_for(engine, "commit")
    def on_commit(_: Any) -> None:
        counts["commits"] += 1

    @event.listens_for(engine, "before_cursor_execute")
    def on_statement(*_: Any) -> None:
        counts["statements"] += 1


def main() -> None:
    """Measure the bounds, then each configuration; print one table and the goals."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, default=2000)
    parser.add_argument("--wave", type=int, default=100, help="flows started at a time")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument(
        "--metrics", action="store_true", help="each node feeds Prometheus metrics (flows.metrics)"
    )
    args = parser.parse_args()
    tune_collector()  # as a node process does once started (flows/process/gc_tuning.py)
    bounds = {
        "off": greenlet_pairs_per_second(max(args.flows, 10_000)),
        "full": sqlite_groups_per_second(max(args.flows, 10_000)),
    }
    print(f"bound: greenlet + msgpack hub {bounds['off']:,.0f} pairs/s; raw sqlite3 FULL, 64 per")
    print(f"       transaction {bounds['full']:,.0f} checkpoint groups/s (same run)")
    print(f"{args.flows} flows per configuration, started {args.wave} at a time (steady state)")
    if args.metrics:
        print("with Prometheus metrics on both nodes (--metrics)")
    header = (
        f"{'config':<8} {'flows/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'commits':>8} "
        f"{'stmts':>7} {'of bound':>9}"
    )
    print(header)
    results = {}
    for config in args.configs:
        row = results[config] = run(config, args.flows, args.wave, args.metrics)
        bound = bounds.get(config)
        ratio = f"{row['flows/s'] / bound:>8.1%}" if bound else f"{'-':>9}"
        commits = "-" if row["commits/flow"] is None else f"{row['commits/flow']:.2f}"
        statements = "-" if row["statements/flow"] is None else f"{row['statements/flow']:.1f}"
        print(
            f"{config:<8} {row['flows/s']:>9,.0f} {row['p50 ms']:>8.1f} {row['p99 ms']:>8.1f} "
            f"{commits:>8} {statements:>7} {ratio}"
        )
        sys.stdout.flush()
    if "full" in args.configs:
        single = run("full", min(args.flows, 200), 1, args.metrics)
        print(
            f"one flow in flight, SQLite FULL: p50 {single['p50 ms']:.1f} ms, p99 "
            f"{single['p99 ms']:.1f} ms, {single['commits/flow']:.1f} commits and "
            f"{single['statements/flow']:.1f} statements per flow (goal: <= 4 commits per node, "
            "p50 <= 5 ms)"
        )
    print("commits and statements: per flow, both nodes together")
    for config, (goal, share) in GOALS.items():
        if config in results:
            reached = results[config]["flows/s"] / bounds[config]
            verdict = "met" if reached >= share else "not yet"
            print(f"goal: {goal}: {reached:.1%} of the bound ({verdict})")


if __name__ == "__main__":
    main()
