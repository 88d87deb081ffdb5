"""One flow with many sessions: is ``receive_all`` and session bookkeeping linear?

One :class:`benchmarks.fanout.FanOutFlow` on Alice opens N sessions to Bob, sends on each and
``receive_all``s the N replies (Bob runs N responders). Both nodes run in one process on the
in-memory network with SQLite checkpoints. For each N it prints the wall time, the time per
session (and without the time spent in Python's cyclic garbage collector, whose full
collections cost more the more objects the process holds), the bytes of checkpoint blobs
Alice wrote, and Alice's commits and checkpoint writes; then the ratio of seconds per session
at the largest N to the smallest (1.0 is linear).

Run: ``python benchmarks/sessions.py [--sessions 1000 10000 50000] [--profile FILE]``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fanout import FanOutFlow
from flows.testing import MockNetwork
from statemachine.state import Checkpoint


class GcTimer:
    """Sums the time Python's cyclic garbage collector runs while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, _: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began


def run(count: int, synchronous: str, profile: str | None) -> dict[str, float]:
    """Run one FanOutFlow with ``count`` sessions to completion; return its figures."""
    with tempfile.TemporaryDirectory() as directory:
        net = MockNetwork(
            cordapps=["benchmarks.fanout"], directory=directory, synchronous=synchronous
        )
        try:
            alice = net.create_node("O=Alice,L=London,C=GB")
            bob = net.create_node("O=Bob,L=New York,C=US")
            written = {"bytes": 0, "largest": 0}

            def note(_: Checkpoint, size: int) -> None:
                written["bytes"] += size
                written["largest"] = max(written["largest"], size)

            alice.node.database.checkpoints.checkpoint_listeners.append(note)
            profiler = cProfile.Profile() if profile else None
            gc.collect()
            began = time.perf_counter()
            if profiler is not None:
                profiler.enable()
            with GcTimer() as collector:
                handle = alice.start_flow(FanOutFlow(bob.party, count))
                net.run_network()
            if profiler is not None:
                profiler.disable()
            elapsed = time.perf_counter() - began
            assert handle.result() == count * (count - 1), handle.result()
            if profiler is not None and profile is not None:
                profiler.dump_stats(profile)
                stats = pstats.Stats(profiler, stream=sys.stderr)
                stats.sort_stats("cumulative").print_stats(25)
                stats.sort_stats("tottime").print_stats(25)
            return {
                "seconds": elapsed,
                "per_session": elapsed / count,
                "gc": collector.seconds,
                "bytes": written["bytes"],
                "largest": written["largest"],
                "commits": alice.node.manager.executor.transactions,
                "checkpoints": alice.node.database.checkpoints.checkpoints_written,
            }
        finally:
            net.stop_nodes()


def main() -> None:
    """Print one row per N and the linearity ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--synchronous", default="NORMAL", choices=["FULL", "NORMAL", "OFF"])
    parser.add_argument(
        "--profile", metavar="FILE", help="cProfile each run into FILE.<N> (prints top entries)"
    )
    args = parser.parse_args()
    print(
        f"{'sessions':>9} {'wall s':>9} {'ms/session':>11} {'gc s':>7} {'less gc':>8} "
        f"{'ckpt MB written':>16} {'largest KB':>11} {'commits':>8} {'ckpts':>7}"
    )
    rows: dict[int, dict[str, float]] = {}
    for count in args.sessions:
        profile = f"{args.profile}.{count}" if args.profile else None
        row = rows[count] = run(count, args.synchronous, profile)
        less_gc = (row["seconds"] - row["gc"]) / count * 1000
        print(
            f"{count:>9} {row['seconds']:>9.2f} {row['per_session'] * 1000:>11.3f} "
            f"{row['gc']:>7.2f} {less_gc:>8.3f} "
            f"{row['bytes'] / 1e6:>16.1f} {row['largest'] / 1e3:>11.1f} "
            f"{row['commits']:>8.0f} {row['checkpoints']:>7.0f}"
        )
        sys.stdout.flush()
    smallest, largest = min(rows), max(rows)
    if largest != smallest:
        ratio = rows[largest]["per_session"] / rows[smallest]["per_session"]

        def less_gc(row: dict[str, float]) -> float:
            return row["seconds"] - row["gc"]

        ratio_less_gc = (less_gc(rows[largest]) / largest) / (less_gc(rows[smallest]) / smallest)
        print(
            f"seconds per session at {largest} / at {smallest} sessions: {ratio:.2f} "
            f"({ratio_less_gc:.2f} less gc; 1.0 is linear)"
        )


if __name__ == "__main__":
    main()
