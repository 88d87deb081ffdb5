"""Instructions per ping/pong, counted by valgrind: a figure that load does not move.

Seconds on a shared machine move with whatever else runs; the number of instructions a
program executes does not. This script runs a worker under ``valgrind --tool=callgrind``
twice, with ``--flows`` and with twice as many in-memory ping/pongs (both nodes in one
process on the test network, the collector tuned as a node process tunes it), and prints
the difference divided by ``--flows``: the instructions one more ping/pong costs, start-up
and warm-up cancelled out. It does the same for the bare greenlet + msgpack hub of
:mod:`benchmarks.bounds` and prints the ratio (issue 14's goal 1 asks fiberflow for at least
40% of the hub's rate, so at most 2.5 times its instructions per pair).

Needs valgrind (Debian's ``valgrind`` package). Each worker runs some 50 times slower
under callgrind than alone: the default 300 flows take about a minute in all.

Run: ``python benchmarks/instructions.py [--flows 300]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_COLLECTED = re.compile(r"Collected\s*:\s*([\d,]+)")


def _worker(kind: str, flows: int) -> None:
    """Run ``flows`` ping/pongs of ``kind`` (``fiberflow`` or ``bound``), after a warm-up."""
    if kind == "bound":
        from benchmarks.bounds import greenlet_pairs_per_second

        greenlet_pairs_per_second(flows)
        return
    from flows.process.gc_tuning import tune_collector
    from flows.testing import MockNetwork
    from samples.pingpong import PingFlow

    with tempfile.TemporaryDirectory() as directory:
        net = MockNetwork(cordapps=["samples.pingpong"], directory=directory, database="memory")
        try:
            alice = net.create_node("O=Alice,L=London,C=GB")
            bob = net.create_node("O=Bob,L=New York,C=US")
            alice.start_flows([PingFlow(bob.party) for _ in range(50)])
            net.run_network()
            tune_collector()
            handles = []
            for start in range(0, flows, 100):
                count = min(100, flows - start)
                handles += alice.start_flows([PingFlow(bob.party) for _ in range(count)])
                net.run_network()
            if not all(handle.result() == "Pong" for handle in handles):
                raise SystemExit("a ping/pong did not return 'Pong'")
        finally:
            net.stop_nodes()


def count_instructions(kind: str, flows: int) -> int:
    """Instructions a run of ``flows`` ping/pongs of ``kind`` executes under callgrind."""
    with tempfile.TemporaryDirectory() as directory:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={Path(directory) / 'callgrind.out'}",
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            kind,
            "--flows",
            str(flows),
        ]
        environment = dict(os.environ, PYTHONPATH=str(ROOT))
        done = subprocess.run(command, capture_output=True, text=True, env=environment)
        if done.returncode != 0:
            raise SystemExit(f"{kind} under callgrind failed:\n{done.stderr[-2000:]}")
        found = _COLLECTED.search(done.stderr)
        if found is None:
            raise SystemExit(f"callgrind printed no instruction count:\n{done.stderr[-2000:]}")
        return int(found.group(1).replace(",", ""))


def per_flow(kind: str, flows: int) -> float:
    """Instructions one more ping/pong costs: (a run of 2n - a run of n) / n."""
    small = count_instructions(kind, flows)
    print(f"  {kind}: {flows} flows counted", flush=True)
    large = count_instructions(kind, 2 * flows)
    print(f"  {kind}: {2 * flows} flows counted", flush=True)
    return (large - small) / flows


def main() -> None:
    """Print instructions per ping/pong for fiberflow and the bound, and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flows", type=int, default=300)
    parser.add_argument("--worker", choices=["fiberflow", "bound"], help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.flows < 100:
        parser.error("--flows must be at least 100")
    if arguments.worker is not None:
        _worker(arguments.worker, arguments.flows)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    print(f"counting instructions under callgrind ({arguments.flows} and {2 * arguments.flows})")
    bound = per_flow("bound", arguments.flows)
    fiberflow = per_flow("fiberflow", arguments.flows)
    print(f"bare greenlet + msgpack hub  {bound:>12,.0f} instructions per pair")
    print(f"fiberflow, in memory         {fiberflow:>12,.0f} instructions per ping/pong")
    print(
        f"fiberflow / bound: {fiberflow / bound:.1f}x "
        f"(goal 1, 40% of the bound's rate, is at most 2.5x)"
    )


if __name__ == "__main__":
    main()
