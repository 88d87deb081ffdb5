"""External operations: 1,000 flows each calling a 50 ms operation, and the node meanwhile.

Issue 20 asks that 1,000 flows each calling a 50 ms operation finish in about
``1,000 x 50 ms / pool size`` and that other flows keep running meanwhile. This script starts
``--flows`` flows on one node (Alice, SQLite FULL, the test network in one process), each
calling an operation that sleeps ``--millis`` ms on the node's pool of ``--threads``
threads, and while they run keeps ping/pongs with Bob going (a wave of ``--wave`` at a time).
It prints the time the operations took against the bound ``flows x millis / threads`` and
the ratio, and the ping/pongs' latency p50/p99 during the run beside the same ping/pongs
with no operation running (measured first, in the same run).

Run: ``python benchmarks/external_operations.py [--flows 1000] [--millis 50] [--threads 16]``.
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

from flows import FlowLogic, OperationContext
from flows.node.handles import FlowHandle
from flows.testing import MockNetwork, MockNode
from samples.pingpong import PingFlow

MILLIS = [50.0]
"""How long each operation sleeps (set from ``--millis``)."""


def slow_operation(context: OperationContext) -> int:
    """Stand in for a 50 ms HTTP call."""
    time.sleep(MILLIS[0] / 1000)
    return context.attempt


class SlowCallFlow(FlowLogic[int]):
    """Call the slow operation once."""

    def call(self) -> int:
        """Wait for the operation's result."""
        result: int = self.call_external(slow_operation)
        return result


def _pings(net: MockNetwork, alice: MockNode, bob: MockNode, wave: int, until: Any) -> list[float]:
    """Keep waves of ping/pongs going until ``until()``; their latencies in seconds."""
    latencies: list[float] = []
    handles: list[FlowHandle[str]] = []
    began = 0.0
    while True:
        if not handles:
            if until():
                return latencies
            handles = alice.start_flows([PingFlow(bob.party) for _ in range(wave)])
            began = time.perf_counter()
        if not net.run_once():
            alice.node.operations.wait_for_end(0.002)
        if all(alice.node.flow_status(h.flow_id).name == "COMPLETED" for h in handles):
            latencies.extend([time.perf_counter() - began] * len(handles))
            handles = []


def main() -> None:
    """Run the benchmark and print its figures (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--flows", type=int, default=1000)
    parser.add_argument("--millis", type=float, default=50.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--wave", type=int, default=10)
    args = parser.parse_args()
    MILLIS[0] = args.millis
    with tempfile.TemporaryDirectory() as directory:
        net = MockNetwork(
            cordapps=["samples.pingpong"], directory=directory, operation_threads=args.threads
        )
        try:
            alice = net.create_node("O=Alice,L=London,C=GB")
            bob = net.create_node("O=Bob,L=New York,C=US")
            quiet_until = time.perf_counter() + 2.0
            alone = _pings(net, alice, bob, args.wave, lambda: time.perf_counter() > quiet_until)
            began = time.perf_counter()
            calls = alice.start_flows([SlowCallFlow() for _ in range(args.flows)])

            def calls_done() -> bool:
                return all(alice.node.flow_status(h.flow_id).name == "COMPLETED" for h in calls)

            during = _pings(net, alice, bob, args.wave, calls_done)
            elapsed = time.perf_counter() - began
            assert all(handle.result() == 1 for handle in calls)
        finally:
            net.stop_nodes()
    bound = args.flows * args.millis / 1000 / args.threads
    print(
        f"{args.flows} flows x {args.millis:g} ms operations on {args.threads} threads: "
        f"{elapsed:.2f} s (bound {bound:.2f} s, {elapsed / bound:.2f}x it)"
    )
    for name, latencies in (("alone", alone), ("during the operations", during)):
        latencies.sort()
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(
            f"ping/pong {name}: {len(latencies)} done, p50 "
            f"{1000 * statistics.median(latencies):.1f} ms, p99 {1000 * p99:.1f} ms"
        )


if __name__ == "__main__":
    main()
