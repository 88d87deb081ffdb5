"""DBOS Transact's ping/pong, for comparison with fiberflow's (issue 14, goal 3: at least 50x).

DBOS is not a fiberflow dependency: run this with a Python that has it, in a virtual
environment of its own::

    python3 -m venv /tmp/dbos-venv && /tmp/dbos-venv/bin/pip install dbos
    /tmp/dbos-venv/bin/python benchmarks/dbos_pingpong.py --pairs 200 \\
        [--database sqlite:////tmp/dbos.sqlite | postgresql://postgres@127.0.0.1:5432/test]

A ping workflow sends a message to a pong workflow with ``DBOS.send`` and waits for the reply
with ``DBOS.recv``; the pong workflow receives it and replies. Both are durable workflows (each
send and receive is checkpointed in DBOS's system database), started ``--concurrency`` pairs at
a time, as fiberflow's benchmarks start their flows. It prints pairs per second (the first
``--warmup`` pairs are not timed). ``benchmarks/transports.py --dbos-python PATH`` runs it
beside fiberflow in the same run and prints the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

try:
    from dbos import DBOS, DBOSConfig
except ImportError:  # pragma: no cover - a message for whoever runs it without DBOS
    print(
        "DBOS is not installed for this Python: python3 -m venv /tmp/dbos-venv && "
        "/tmp/dbos-venv/bin/pip install dbos, then run this with /tmp/dbos-venv/bin/python",
        file=sys.stderr,
    )
    sys.exit(2)


@DBOS.workflow()
def pong() -> str:
    """Receive a ping and answer it."""
    ping = DBOS.recv("ping", timeout_seconds=120)
    assert isinstance(ping, dict), ping
    DBOS.send(ping["reply_to"], "Pong", "pong")
    return str(ping["text"])


@DBOS.workflow()
def ping(pong_id: str) -> str:
    """Send a ping to ``pong_id`` and wait for its answer."""
    DBOS.send(pong_id, {"reply_to": DBOS.workflow_id, "text": "Ping"}, "ping")
    answer = DBOS.recv("pong", timeout_seconds=120)
    return str(answer)


def run_pairs(count: int, concurrency: int) -> float:
    """Seconds to run ``count`` ping/pong pairs, ``concurrency`` at a time."""
    began = time.perf_counter()
    done = 0
    while done < count:
        batch = min(concurrency, count - done)
        handles: list[Any] = []
        for _ in range(batch):
            responder = DBOS.start_workflow(pong)
            handles.append(DBOS.start_workflow(ping, responder.workflow_id))
            handles.append(responder)
        for handle in handles:
            result = handle.get_result()
            assert result in ("Pong", "Ping"), result
        done += batch
    return time.perf_counter() - began


def main() -> None:
    """Launch DBOS on the database, run the pairs, print pairs per second."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--database", default=None, help="default: a new SQLite file")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="dbos-bench-")
    database = args.database or f"sqlite:///{os.path.join(directory, 'dbos.sqlite')}"
    config: DBOSConfig = {"name": "pingpong-bench", "system_database_url": database}
    DBOS(config=config)
    DBOS.launch()
    try:
        run_pairs(args.warmup, args.concurrency)
        seconds = run_pairs(args.pairs, args.concurrency)
    finally:
        DBOS.destroy()
    print(f"dbos {args.pairs} pairs in {seconds:.2f} s: {args.pairs / seconds:.1f} pairs/s")


if __name__ == "__main__":
    main()
