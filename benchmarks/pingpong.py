"""Completed ping/pong flows per second, in one process, on the in-memory transport.

Compares durable SQLite checkpoints (WAL, synchronous=FULL), SQLite with synchronous=NORMAL,
and checkpoints off (the non-durable in-memory store), for 1,000 and 10,000 flows, all in one
run so the ratios are comparable. Run: ``python benchmarks/pingpong.py [--flows 1000 10000]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flows.testing import MockNetwork
from samples.pingpong import PingFlow

CONFIGS: dict[str, tuple[str, str]] = {
    "sqlite FULL": ("sqlite", "FULL"),
    "sqlite NORMAL": ("sqlite", "NORMAL"),
    "checkpoints off": ("memory", "NORMAL"),
}


def run(config: str, flows: int) -> dict[str, float]:
    """Start ``flows`` PingFlows, run the network to quiescence, time both phases."""
    with tempfile.TemporaryDirectory() as directory:
        database, synchronous = CONFIGS[config]
        net = MockNetwork(
            cordapps=["samples.pingpong"],
            directory=directory,
            database=database,
            synchronous=synchronous,
        )
        try:
            alice = net.create_node("O=Alice,L=London,C=GB")
            bob = net.create_node("O=Bob,L=New York,C=US")
            began = time.perf_counter()
            handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(flows)]
            started = time.perf_counter()
            net.run_network()
            finished = time.perf_counter()
            assert all(h.result() == "Pong" for h in handles)
            transactions = sum(n.node.manager.executor.transactions for n in net.nodes)
            checkpoints = sum(n.node.database.checkpoints.checkpoints_written for n in net.nodes)
        finally:
            net.stop_nodes()
    total = finished - began
    return {
        "flows/s": flows / total,
        "start s": started - began,
        "run s": finished - started,
        "total s": total,
        "transactions": transactions,
        "checkpoints": checkpoints,
    }


def main() -> None:
    """Print one table of figures and the ratios against checkpoints off."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, nargs="+", default=[1000, 10000])
    args = parser.parse_args()
    print(
        f"{'config':<16} {'flows':>7} {'flows/s':>9} {'start s':>8} {'run s':>8} "
        f"{'total s':>8} {'txns':>7} {'ckpts':>7} {'vs off':>7}"
    )
    for flows in args.flows:
        rows = {config: run(config, flows) for config in CONFIGS}
        baseline = rows["checkpoints off"]["flows/s"]
        for config, row in rows.items():
            print(
                f"{config:<16} {flows:>7} {row['flows/s']:>9,.0f} {row['start s']:>8.2f} "
                f"{row['run s']:>8.2f} {row['total s']:>8.2f} {row['transactions']:>7.0f} "
                f"{row['checkpoints']:>7.0f} {row['flows/s'] / baseline:>7.2f}"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
