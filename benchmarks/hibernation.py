"""Waiting flows: memory per parked flow, restart time, wake-up latency (issue 15).

Alice and Bob run in one process (``MockNetwork``, SQLite files). Three measurements:

* ``memory``: park N flows, N/2 pairs (Alice's ``ParkedFlow`` and Bob's ``ParkedResponder``
  both wait for ever on a receive) and print the resident memory the operating system
  reports, after a collection, per parked flow: with every waiting flow in memory and with
  every waiting flow hibernated (``hibernate_after=0``), and how many flows are actually
  parked. Goal: 1,000,000 parked flows in at most 2 GiB (2 KiB a flow).
* ``restart``: with N pairs parked, restart both nodes, then run one new ping/pong; prints the
  time to read the index (the restart) and the time until that ping/pong completes (first
  service), and for comparison, in the same run, an eager restore (every flow restored and
  replayed before the ping). Goal: a new ping/pong at most 5 s after the start with 100,000
  checkpoints.
* ``wake``: one ``PausingPingFlow`` at a time pings, sleeps, pings again; the time from its
  timer to the end of the second exchange, with Bob's responder kept in memory and with it
  hibernated in between (so the second ping wakes it): p50 and p99 of each, and the p50
  difference (goal: at most 5 ms on SQLite). SQLite runs with ``synchronous=FULL`` here.

Run: ``python benchmarks/hibernation.py [--parts memory restart wake] [--memory 10000 100000]
[--restart 10000 100000] [--wake 200]`` (``--memory`` counts flows, ``--restart`` pairs, that
is checkpoints on each node); ``--memory 1000000`` parks a million flows (about 15 minutes on
this machine). Each memory row runs in a fresh process of its own, so that no row reuses
memory an earlier one freed.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.parked_flows import ParkedFlow, PausingPingFlow
from flows.node.resident_memory import resident_bytes
from flows.process.gc_tuning import tune_collector
from flows.testing import MockNetwork, MockNode
from samples.pingpong import PingFlow

CORDAPPS = ["benchmarks.parked_flows", "samples.pingpong"]
ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"
START_BATCH = 2000
"""Pairs started per transaction while parking."""


def _network(directory: str, hibernate_after: float | None, synchronous: str) -> MockNetwork:
    net = MockNetwork(
        cordapps=CORDAPPS,
        directory=directory,
        synchronous=synchronous,
        hibernate_after=hibernate_after,
    )
    net.create_node(ALICE)
    net.create_node(BOB)
    return net


def _parked(node: MockNode) -> int:
    """Flows of ``node`` waiting (in memory, suspended) or dormant."""
    counts = node.node.manager.flow_counts()
    return counts.dormant + sum(counts.waiting_in_memory.values())


def park(net: MockNetwork, pairs: int, label: str) -> float:
    """Park ``pairs`` more pairs; prints progress; returns the seconds it took."""
    alice, bob = net.nodes
    began = time.perf_counter()
    started = 0
    step = max(pairs // 10, START_BATCH)
    next_report = step
    while started < pairs:
        count = min(START_BATCH, pairs - started)
        alice.start_flows([ParkedFlow(bob.party) for _ in range(count)])
        net.run_network(advance_clock=False)
        started += count
        if started >= next_report and pairs >= 100_000:
            elapsed = time.perf_counter() - began
            print(f"    {label}: {started:,} pairs parked in {elapsed:.0f} s", flush=True)
            next_report += step
    return time.perf_counter() - began


def measure_memory(pairs: int, hibernate_after: float | None) -> dict[str, float]:
    """Resident memory per parked flow with ``pairs`` pairs parked."""
    with tempfile.TemporaryDirectory() as directory:
        net = _network(directory, hibernate_after, "NORMAL")
        try:
            park(net, 10, "warm-up")  # every module loaded, every connection open
            gc.collect()
            before = resident_bytes()
            seconds = park(net, pairs, "hibernated" if hibernate_after == 0 else "in memory")
            gc.collect()
            after = resident_bytes()
            alice, bob = net.nodes
            parked = _parked(alice) + _parked(bob) - 20
            dormant = sum(node.node.manager.flow_counts().dormant for node in net.nodes)
        finally:
            net.stop_nodes()
    return {
        "parked": parked,
        "dormant": dormant,
        "bytes/flow": (after - before) / parked,
        "rss MiB": after / 2**20,
        "seconds": seconds,
    }


def measure_memory_in_a_process(pairs: int, hibernate_after: float | None) -> dict[str, float]:
    """:func:`measure_memory` in a fresh Python process, so no earlier run's freed memory is
    reused (the allocator keeps what a process freed): each row's figure is its own."""
    command = [sys.executable, __file__, "--one-memory-row", str(pairs)]
    if hibernate_after is None:
        command.append("--keep-in-memory")
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        last = ""
        for line in child.stdout:  # progress lines as they come; the row (JSON) last
            if last:
                print(last, end="", flush=True)
            last = line
    if child.returncode != 0:
        raise SystemExit(f"the measuring process failed (exit {child.returncode})")
    row: dict[str, float] = json.loads(last)
    return row


def measure_restart(pairs: int) -> dict[str, float]:
    """Restart two nodes holding ``pairs`` parked pairs; time the index and a new ping/pong."""
    with tempfile.TemporaryDirectory() as directory:
        net = _network(directory, 0, "NORMAL")
        try:
            park(net, pairs, "parking")
            alice, bob = net.nodes
            began = time.perf_counter()
            alice.restart()
            bob.restart()
            index = time.perf_counter() - began
            began = time.perf_counter()
            handle = alice.start_flow(PingFlow(bob.party))
            net.run_network(advance_clock=False)
            assert handle.result() == "Pong"
            first = time.perf_counter() - began
            dormant = alice.node.manager.flow_counts().dormant
            began = time.perf_counter()
            alice.restart()
            bob.restart()
            restored = (
                alice.node.manager.dormancy.restore_all() + bob.node.manager.dormancy.restore_all()
            )
            handle = alice.start_flow(PingFlow(bob.party))
            net.run_network(advance_clock=False)
            assert handle.result() == "Pong"
            eager = time.perf_counter() - began
        finally:
            net.stop_nodes()
    return {
        "index s": index,
        "first s": first,
        "total s": index + first,
        "dormant": dormant,
        "eager s": eager,
        "restored": restored,
    }


def measure_wake(flows: int, hibernate_responder: bool) -> list[float]:
    """Seconds from the timer to the end of the second exchange, one flow at a time."""
    latencies = []
    with tempfile.TemporaryDirectory() as directory:
        net = _network(directory, None, "FULL")
        try:
            alice, bob = net.nodes
            for _ in range(flows + 10):
                handle = alice.start_flow(PausingPingFlow(bob.party, 10.0))
                net.run_network(advance_clock=False)
                if hibernate_responder:
                    manager = bob.node.manager
                    assert (
                        manager.dormancy.hibernate([s.flow_id for s in manager.live_flows()]) == 1
                    )
                net.clock.advance(10.0)
                began = time.perf_counter()
                net.run_network(advance_clock=False)
                latencies.append(time.perf_counter() - began)
                assert handle.result() == "two"
        finally:
            net.stop_nodes()
    return latencies[10:]  # the first ones warm up


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    """Run the chosen parts and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["memory", "restart", "wake"],
        default=["memory", "restart", "wake"],
    )
    parser.add_argument("--memory", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument(
        "--in-memory-up-to",
        type=int,
        default=100_000,
        help="measure flows kept in memory only up to this many pairs",
    )
    parser.add_argument("--restart", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--wake", type=int, default=200)
    parser.add_argument("--one-memory-row", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keep-in-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tune_collector()
    if args.one_memory_row is not None:  # a child of measure_memory_in_a_process
        began = time.perf_counter()
        row = measure_memory(args.one_memory_row, None if args.keep_in_memory else 0.0)
        row["wall s"] = time.perf_counter() - began
        print(json.dumps(row), flush=True)
        return
    if "memory" in args.parts:
        print("memory per parked flow (resident, after a collection; flows in pairs)")
        print(
            f"{'flows':>10} {'mode':>11} {'parked':>10} {'dormant':>10} {'B/flow':>8} "
            f"{'RSS MiB':>8} {'park s':>7} {'wall s':>7}"
        )
        for flows in args.memory:
            pairs = flows // 2
            modes = [0.0] + ([None] if flows <= args.in_memory_up_to else [])
            for hibernate_after in modes:
                row = measure_memory_in_a_process(pairs, hibernate_after)
                mode = "hibernated" if hibernate_after == 0 else "in memory"
                print(
                    f"{flows:>10,} {mode:>11} {row['parked']:>10,.0f} {row['dormant']:>10,.0f} "
                    f"{row['bytes/flow']:>8,.0f} {row['rss MiB']:>8,.0f} "
                    f"{row['seconds']:>7,.0f} {row['wall s']:>7,.0f}",
                    flush=True,
                )
        print(
            "goal: at most 2,048 B per parked flow (1M flows in 2 GiB); each row ran in a "
            "process of its own (RSS MiB: the whole process, both nodes)"
        )
    if "restart" in args.parts:
        print("restart of two nodes holding parked pairs, then one new ping/pong")
        print(
            f"{'pairs':>10} {'index s':>8} {'first s':>8} {'total s':>8} {'dormant':>9} "
            f"{'eager s':>8} {'ratio':>6}"
        )
        for pairs in args.restart:
            row = measure_restart(pairs)
            print(
                f"{pairs:>10,} {row['index s']:>8.2f} {row['first s']:>8.2f} "
                f"{row['total s']:>8.2f} {row['dormant']:>9,.0f} {row['eager s']:>8.2f} "
                f"{row['eager s'] / row['total s']:>6.1f}",
                flush=True,
            )
        print(
            "goal: total at most 5 s with 100,000 checkpoints (eager: every flow restored "
            "and replayed first, as before)"
        )
    if "wake" in args.parts:
        kept = measure_wake(args.wake, False)
        woken = measure_wake(args.wake, True)
        print(
            f"wake-up: {args.wake} PausingPingFlows one at a time, SQLite FULL; ms from the "
            "timer to the end of the second exchange"
        )
        for label, values in (("responder in memory", kept), ("responder hibernated", woken)):
            print(
                f"  {label:>21}: p50 {1e3 * _percentile(values, 0.5):6.2f}  "
                f"p99 {1e3 * _percentile(values, 0.99):6.2f}"
            )
        added = 1e3 * (_percentile(woken, 0.5) - _percentile(kept, 0.5))
        print(f"  waking the responder adds {added:.2f} ms at p50 (goal: at most 5 ms)")


if __name__ == "__main__":
    main()
