"""SIGKILL campaign: real node processes killed at seeded-random moments, nothing lost.

    python -m tests.kill_campaign [--flows 200] [--kills 20] [--seed 1]
        [--transport URL | --p2p] [--database postgresql://...]

Defaults: SQLite node databases and the SQL queue in a SQLite file, in a temporary
directory. Prints every kill and, at the end, the number of kills survived.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.process_cluster import run_kill_campaign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, default=200)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--transport")
    parser.add_argument("--database")
    parser.add_argument(
        "--p2p", action="store_true", help="each node its own inbound (SQL queue file), bridges"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fiberflow-kill-") as directory:
        transport = args.transport or f"sqlite:///{Path(directory) / 'queue.db'}"
        where = "peer to peer, an inbound file per node" if args.p2p else f"transport {transport}"
        print(f"{args.flows} flows, {args.kills} kills, seed {args.seed}, {where}")
        report = run_kill_campaign(
            Path(directory),
            transport,
            args.database,
            args.flows,
            args.kills,
            args.seed,
            print,
            p2p=args.p2p,
        )
    print(
        f"all {report.flows} flows completed exactly once; {report.kills} SIGKILLs survived "
        f"({report.kills_by_node}) in {report.seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
