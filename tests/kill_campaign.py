"""SIGKILL campaign: real node processes killed at seeded-random moments, nothing lost.

    python -m tests.kill_campaign [--flows 200] [--kills 20] [--seed 1]
        [--transport URL | --p2p] [--database postgresql://...]
    python -m tests.kill_campaign --workers 3 --database postgresql://... [--transport URL]
        [--flows 600] [--kills 100] [--seed 1]

Defaults: SQLite node databases and the SQL queue in a SQLite file, in a temporary
directory. Prints every kill and, at the end, the number of kills survived.

With ``--workers N``, Alice runs as N worker processes (the node database must be on
PostgreSQL; the transport defaults to the SQL queue in that database) and ``--kills``
disruptions hit her workers: three in four a SIGKILL (restarted), one in four a SIGSTOP for
up to two and a half leases then SIGCONT (a worker frozen past its lease is taken over and,
thawed, must exit committing nothing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.process_cluster import run_kill_campaign, run_worker_campaign


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
    parser.add_argument("--workers", type=int, help="run Alice as this many worker processes")
    args = parser.parse_args()
    if args.workers is not None:
        return workers_campaign(args)
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


def workers_campaign(args: argparse.Namespace) -> int:
    """The campaign against the workers of one node (``--workers``)."""
    if not args.database or not args.database.startswith("postgresql"):
        print(
            "--workers needs --database postgresql://... (workers share a PostgreSQL node "
            "database)",
            file=sys.stderr,
        )
        return 2
    transport = args.transport or args.database
    print(
        f"{args.flows} flows, {args.kills} disruptions of {args.workers} workers, seed "
        f"{args.seed}, transport {transport}"
    )
    with tempfile.TemporaryDirectory(prefix="fiberflow-workers-") as directory:
        report = run_worker_campaign(
            Path(directory),
            transport,
            args.database,
            args.flows,
            args.kills,
            args.seed,
            workers=args.workers,
            say=print,
        )
    print(
        f"all {report.flows} flows completed exactly once, every effect once; {report.kills} "
        f"SIGKILLs and {report.stops} SIGSTOPs survived ({report.fenced} frozen workers fenced "
        f"out after a takeover) in {report.seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
