"""The ``fiberflow`` command line."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from flows.testing import MockNetwork
from samples.pingpong import PingFlow
from statemachine.state import Checkpoint

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


def _describe_checkpoint(node: str, checkpoint: Checkpoint, size: int) -> str:
    pending = checkpoint.pending
    waiting = ""
    if pending is not None:
        waiting = f", waiting on {pending.request.describe()}"
    flow = checkpoint.flow_class.rsplit(".", 1)[-1]
    return (
        f"  checkpoint  {node:<6} {flow:<9} {checkpoint.flow_id[:8]}  "
        f"{checkpoint.status.value:<9} journal={len(checkpoint.journal)} "
        f"bytes={size}{waiting}"
    )


def run_demo(flows: int, directory: Path | None, verbose: bool) -> int:
    """Ping/pong between Alice and Bob in one process; print results and checkpoints."""
    with MockNetwork(
        cordapps=["samples.pingpong"], directory=directory, synchronous="FULL"
    ) as network:
        alice = network.create_node(ALICE)
        bob = network.create_node(BOB)
        print(f"fiberflow demo: {flows} ping/pong flow(s) between {ALICE} and {BOB}")
        print(f"  databases:  {network.directory} (SQLite, WAL, synchronous=FULL)")
        print("  transport:  in-process memory network")
        show = verbose or flows <= 3
        for mock in (alice, bob):
            short = mock.party.organisation

            def listener(checkpoint: Checkpoint, size: int, short: str = short) -> None:
                if show:
                    print(_describe_checkpoint(short, checkpoint, size))

            mock.node.database.checkpoint_listeners.append(listener)
        started = time.perf_counter()
        handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(flows)]
        rounds = network.run_network()
        elapsed = time.perf_counter() - started
        results = [h.result() for h in handles]
        for handle, result in list(zip(handles, results, strict=True))[:3]:
            print(f"  result      PingFlow {handle.flow_id[:8]} -> {result!r}")
        if len(results) > 3:
            print(f"  ... {len(results) - 3} more results")
        ok = results == ["Pong"] * flows
        written = sum(m.node.database.checkpoints_written for m in (alice, bob))
        sent = network.messaging.statistics.sent
        left = len(alice.checkpoints()) + len(bob.checkpoints())
        print(
            f"  summary     {flows} flows in {elapsed:.3f} s ({flows / elapsed:,.0f} flows/s), "
            f"{rounds} rounds, {written} checkpoints written, {sent} messages sent, "
            f"{left} checkpoints left"
        )
        print("  all flows returned 'Pong'" if ok else "  SOME FLOWS FAILED")
        return 0 if ok and left == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fiberflow`` console script."""
    parser = argparse.ArgumentParser(prog="fiberflow", description=__doc__)
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run ping/pong between two nodes")
    demo.add_argument("--flows", type=int, default=1, help="how many ping/pong flows (default 1)")
    demo.add_argument("--directory", type=Path, help="keep the node databases here")
    demo.add_argument("--verbose", action="store_true", help="print every checkpoint written")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s %(message)s")
    if args.command == "demo":
        if args.flows < 1:
            parser.error("--flows must be at least 1")
        return run_demo(args.flows, args.directory, args.verbose)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
