"""DBOS Transact doing fiberflow's ping/pong: pairs per second, for issue 14's comparison.

Not part of fiberflow and never one of its dependencies: install DBOS into a virtual
environment of its own and run this script with that interpreter::

    python3 -m venv /tmp/dbos-venv && /tmp/dbos-venv/bin/pip install dbos
    /tmp/dbos-venv/bin/python benchmarks/dbos_pingpong.py --pairs 200 [--database URL]

A pair is two durable workflows: ``ping`` sends "Ping" to its ``pong`` (``DBOS.send``) and
waits for the answer (``DBOS.recv``); ``pong`` waits for the ping and sends "Pong" back. That
is what a fiberflow ping/pong does (a flow each side, a message each way, each step durable).
All pairs are started at once (as benchmarks/transports.py asks for all its flows at once),
in one process: DBOS runs workflows on threads, so this is its best case, not two processes.
It prints pairs per second from the first start to the last result. The system database is a
SQLite file (default) or a PostgreSQL URL (the database must exist; DBOS makes its schema).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid

from dbos import DBOS, DBOSConfig, SetWorkflowID


@DBOS.workflow()  # type: ignore[untyped-decorator]
def pong() -> str:
    """Wait for the ping; answer it."""
    ping, sender = DBOS.recv("ping", timeout_seconds=120)
    DBOS.send(sender, "Pong", "pong")
    return str(ping)


@DBOS.workflow()  # type: ignore[untyped-decorator]
def ping(pong_id: str) -> str:
    """Send "Ping" to ``pong_id``; wait for its answer."""
    DBOS.send(pong_id, ("Ping", DBOS.workflow_id), "ping")
    return str(DBOS.recv("pong", timeout_seconds=120))


def main() -> None:
    """Run the pairs; print pairs per second."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--database", help="the system database URL (default: a SQLite file)")
    args = parser.parse_args()
    url = args.database or f"sqlite:///{os.path.join(tempfile.mkdtemp(), 'dbos.sqlite')}"
    config: DBOSConfig = {
        "name": f"pingpong{uuid.uuid4().hex[:6]}",
        "system_database_url": url,
        "max_executor_threads": max(64, 2 * args.pairs + 8),
        "sys_db_pool_size": 20,
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        began = time.perf_counter()
        handles = []
        for _ in range(args.pairs):
            pong_id = uuid.uuid4().hex
            with SetWorkflowID(pong_id):
                DBOS.start_workflow(pong)
            handles.append(DBOS.start_workflow(ping, pong_id))
        results = [handle.get_result() for handle in handles]
        elapsed = time.perf_counter() - began
        assert results == ["Pong"] * args.pairs, results[:3]
        print(
            f"DBOS {args.pairs} ping/pong pairs on {url.split('://')[0]}: {elapsed:.2f} s, "
            f"{args.pairs / elapsed:,.1f} pairs/s"
        )
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
