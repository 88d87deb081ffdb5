"""One flow with many sessions: is ``receive_all`` and session bookkeeping linear?

One :class:`benchmarks.fanout.FanOutFlow` on Alice opens N sessions to Bob, sends on each and
``receive_all``s the N replies (Bob runs N responders). Both nodes run in one process on the
in-memory network with SQLite checkpoints. For each N it prints the wall time, the time per
session, the bytes of checkpoint blobs Alice wrote, and Alice's commits and checkpoint writes;
then the ratio of seconds per session at the largest N to the smallest (1.0 is linear).

Run: ``python benchmarks/sessions.py [--sessions 1000 10000 50000] [--profile FILE]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fanout import FanOutFlow
from flows.testing import MockNetwork
from statemachine.state import Checkpoint


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

            alice.node.database.checkpoint_listeners.append(note)
            profiler = cProfile.Profile() if profile else None
            began = time.perf_counter()
            if profiler is not None:
                profiler.enable()
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
                "bytes": written["bytes"],
                "largest": written["largest"],
                "commits": alice.node.manager.executor.transactions,
                "checkpoints": alice.node.database.checkpoints_written,
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
        f"{'sessions':>9} {'wall s':>9} {'ms/session':>11} {'ckpt MB written':>16} "
        f"{'largest KB':>11} {'commits':>8} {'ckpts':>7}"
    )
    rows: dict[int, dict[str, float]] = {}
    for count in args.sessions:
        profile = f"{args.profile}.{count}" if args.profile else None
        row = rows[count] = run(count, args.synchronous, profile)
        print(
            f"{count:>9} {row['seconds']:>9.2f} {row['per_session'] * 1000:>11.3f} "
            f"{row['bytes'] / 1e6:>16.1f} {row['largest'] / 1e3:>11.1f} "
            f"{row['commits']:>8.0f} {row['checkpoints']:>7.0f}"
        )
        sys.stdout.flush()
    smallest, largest = min(rows), max(rows)
    if largest != smallest:
        ratio = rows[largest]["per_session"] / rows[smallest]["per_session"]
        print(
            f"seconds per session at {largest} / at {smallest} sessions: {ratio:.2f} "
            "(1.0 is linear)"
        )


if __name__ == "__main__":
    main()
