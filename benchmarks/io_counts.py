"""What a ping/pong costs the node databases, counted: statements, commits, round trips.

Throughput on a shared machine is noisy, and in a two-process run the batch sizes (so the
statements per flow) depend on timing too. This benchmark counts instead, deterministically:
Alice and Bob run in one process on the test network (``MockNetwork``, stepped), each flow is
asked for as a client asks (a row in ``node_flow_requests``, started by
``Node.start_requested_flows``), and for each database it prints, per flow and per node:

* SQL statements (an ``executemany`` counts once), by kind (BEGIN, SELECT, INSERT, UPDATE,
  DELETE, COMMIT, ROLLBACK, other), and commits;
* PostgreSQL round trips (psycopg waits for a reply from the server).

Two shapes: ``one`` flow in flight at a time (every round does one flow's work: the fixed
costs of a round show), and ``wave``s of ``--wave`` flows requested together (what group
commit makes of them). The test network relays inline (the outbox rows a round sent are
deleted at its end); node processes relay on a thread (benchmarks/transports.py).

Run: ``python benchmarks/io_counts.py [--flows 20] [--wave 50] [--databases sqlite postgresql]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine, event

from benchmarks.round_trips import counting_wait
from flows.node.flow_requests import encode_arguments
from flows.testing import MockNetwork, MockNode
from foundation.serialization import qualified_name
from persistence.node_store import FlowRequest
from samples.pingpong import PingFlow

POSTGRES_URL = os.environ.get(
    "FIBERFLOW_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
KINDS = ("BEGIN", "SELECT", "INSERT", "UPDATE", "DELETE", "COMMIT", "ROLLBACK")


class Counts:
    """Statements by kind, commits and round trips, per node (by its engine)."""

    def __init__(self) -> None:
        self.by_node: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.current: str | None = None
        """The node whose round runs now (round trips are charged to it)."""
        self.counting = False
        """Off while the client asks for flows and while the results are checked."""

    def watch(self, engine: Engine, name: str) -> None:
        """Count what ``engine`` (a node's) runs, as ``name``'s."""

        @event.listens_for(engine, "before_cursor_execute")
        def _statement(_: Any, __: Any, statement: str, *___: Any) -> None:
            if not self.counting:
                return
            word = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
            self.by_node[name][word if word in KINDS else "other"] += 1

        @event.listens_for(engine, "begin")
        def _begin(_: Any) -> None:
            if self.counting and engine.dialect.name == "postgresql":
                self.by_node[name]["BEGIN"] += 1  # psycopg sends it with the first statement

        @event.listens_for(engine, "commit")
        def _commit(_: Any) -> None:
            if self.counting:
                self.by_node[name]["commits"] += 1

    def round_trip(self) -> None:
        """psycopg did one round trip for the node running now."""
        if self.counting and self.current is not None:
            self.by_node[self.current]["round trips"] += 1


def _count_round_trips(counts: Counts) -> None:
    """Charge every psycopg wait that does I/O to ``counts.current``."""
    try:
        import psycopg
    except ImportError:
        return
    wait = counting_wait(psycopg.Connection.wait, lambda _: counts.round_trip())
    psycopg.Connection.wait = wait  # type: ignore[method-assign]


def _request(node: MockNode, bob: MockNode, count: int) -> list[str]:
    """Ask ``node`` for ``count`` PingFlows to ``bob`` as a client does; their ids."""
    requests = []
    for _ in range(count):
        flow = PingFlow(bob.party)
        requests.append(
            FlowRequest(uuid.uuid4().hex, qualified_name(PingFlow), encode_arguments(flow))
        )
    node.node.database.control.request_flows(requests, time.time())
    return [request.request_id for request in requests]


def measure(counts: Counts, database: str, flows: int, wave: int) -> dict[str, dict[str, float]]:
    """Run ``flows`` ping/pongs, ``wave`` at a time; ``counts`` per flow by node."""
    with tempfile.TemporaryDirectory() as directory:
        net = MockNetwork(
            cordapps=["samples.pingpong"],
            directory=directory,
            database=database,
            synchronous="FULL",
        )
        try:
            alice = net.create_node("O=Alice,L=London,C=GB")
            bob = net.create_node("O=Bob,L=New York,C=US")
            nodes = {"alice": alice, "bob": bob}
            for name, mock in nodes.items():
                counts.watch(mock.node.database.engine, name)  # type: ignore[union-attr]
            originals = {name: mock.node.run_once for name, mock in nodes.items()}

            def charged(name: str) -> Any:
                def run_once() -> bool:
                    counts.current = name
                    try:
                        return originals[name]()
                    finally:
                        counts.current = None

                return run_once

            for name, mock in nodes.items():
                mock.node.run_once = charged(name)  # type: ignore[method-assign]
            net.run_network()
            counts.by_node.clear()
            done = 0
            while done < flows:
                batch = min(wave, flows - done)
                ids = _request(alice, bob, batch)
                counts.counting = True
                counts.current = "alice"
                alice.node.start_requested_flows()
                counts.current = None
                net.run_network()
                counts.counting = False
                for flow_id in ids:
                    assert alice.node.flow_result(flow_id) == "Pong"
                done += batch
        finally:
            net.stop_nodes()
    return {
        name: {key: value / flows for key, value in counter.items()}
        for name, counter in counts.by_node.items()
    }


def main() -> None:
    """Count each database in both shapes; print a table per database."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, default=20, help="flows one at a time")
    parser.add_argument("--wave", type=int, default=50, help="flows requested together")
    parser.add_argument(
        "--databases", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    args = parser.parse_args()
    counts = Counts()
    _count_round_trips(counts)
    columns = [*KINDS, "other", "commits", "round trips"]
    for database in args.databases:
        url = POSTGRES_URL if database == "postgresql" else "sqlite"
        print(f"\n{database}: per flow (ping/pong requested by a client), per node")
        print(
            f"  {'shape':<12} {'node':<6} {'stmts':>6} " + " ".join(f"{c[:8]:>8}" for c in columns)
        )
        shapes = (("one", 1, args.flows), ("wave", args.wave, args.wave * 2))
        for shape, wave, flows in shapes:
            measured = measure(counts, url, flows, wave)
            for node in ("alice", "bob"):
                row = measured.get(node, {})
                statements = sum(row.get(kind, 0) for kind in (*KINDS, "other"))
                if database == "postgresql":
                    statements -= row.get("BEGIN", 0)  # counted from the begin event, not sent
                cells = " ".join(f"{row.get(c, 0):8.2f}" for c in columns)
                label = f"{shape} ({wave})"
                print(f"  {label:<12} {node:<6} {statements:6.2f} {cells}")
    print(
        "\nstmts: statements sent (an executemany once); on PostgreSQL BEGIN goes with the "
        "first statement of a transaction (counted, not sent alone). The test network's inline "
        "relay deletes sent rows at the end of each round."
    )


if __name__ == "__main__":
    main()
