"""Ping/pong flows per second on each transport and database, beside the raw transports.

Every configuration runs Alice and Bob as two node processes (``fiberflow node run``), as
the demo does, and times N ping/pong flows from the commit of the flow requests to the last
outcome. Beside them, the raw transport moves N messages without fiberflow:

* raw SQL: per message, INSERT (commit), SELECT the oldest, DELETE it (commit), on the same
  database as the SQL queue (SQLite with synchronous=FULL, or PostgreSQL);
* raw pika: publish with publisher confirms, then consume with manual acks, N messages.

A ping/pong flow moves 4 session messages (initial+ping, confirm, pong, end), so the ratio
printed is the framework's messages per second over the raw transport's: how much of the
transport's speed survives checkpoints, dedup, outbox and the session protocol.

The ``p2p`` row runs the peer-to-peer topology (each node its own SQL queue file as its
inbound, a bridge per peer, certificates from a network root) beside the shared SQL queue
file: what the bridges cost.

Run: ``python benchmarks/transports.py [--flows 1000] [--messages 2000]``. Configurations
whose service is unreachable are listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Column, Integer, LargeBinary, MetaData, Table, create_engine, select

from flows.cli.demo import run_pingpong_processes
from foundation.engine import configure_sqlite, normalize_url

POSTGRES_URL = os.environ.get(
    "FIBERFLOW_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
RABBITMQ_URL = os.environ.get(
    "FIBERFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"
)
MESSAGES_PER_FLOW = 4


RAW_BATCH = 100
"""Messages per commit of the raw SQL queue (sender and receiver alike)."""
TX_BATCH = 256
"""Messages per AMQP transaction of the raw publisher (as ``messaging.amqp.publisher``)."""
RAW_PREFETCH = 2000
"""Deliveries the raw AMQP consumer may hold unacknowledged (as a node's consumer)."""


def raw_sql(url: str, messages: int) -> float:
    """Messages per second through a bare table used well: batched commits on both sides.

    The sender inserts :data:`RAW_BATCH` messages per transaction; the receiver, in one
    transaction per batch, selects the oldest :data:`RAW_BATCH` and deletes them.
    """
    engine = create_engine(normalize_url(url))
    if engine.dialect.name == "sqlite":
        configure_sqlite(engine, "FULL")
    metadata = MetaData()
    table = Table(
        f"bench_raw_{uuid.uuid4().hex[:8]}",
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("data", LargeBinary, nullable=False),
    )
    metadata.create_all(engine)
    payload = b"x" * 200
    try:
        began = time.perf_counter()
        for start in range(0, messages, RAW_BATCH):
            count = min(RAW_BATCH, messages - start)
            with engine.begin() as connection:
                connection.execute(table.insert(), [{"data": payload}] * count)
            with engine.begin() as connection:
                oldest = select(table.c.id, table.c.data).order_by(table.c.id).limit(count)
                ids = [row.id for row in connection.execute(oldest)]
                assert len(ids) == count
                connection.execute(table.delete().where(table.c.id.in_(ids)))
        return messages / (time.perf_counter() - began)
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def raw_pika(url: str, messages: int) -> float:
    """Messages per second used well: publish in transactions, consume with batched acks.

    Publishing is what fiberflow's publisher does (one ``tx.commit``, i.e. one durable round
    trip, per :data:`TX_BATCH` persistent messages); the consumer holds up to
    :data:`RAW_PREFETCH` deliveries and acknowledges every 100th with ``multiple=True``.
    """
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    queue = f"bench.raw.{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "classic"})
    channel.tx_select()
    consumer_channel = connection.channel()
    consumer_channel.basic_qos(prefetch_count=RAW_PREFETCH)
    properties = pika.BasicProperties(delivery_mode=2)
    payload = b"x" * 200
    try:
        began = time.perf_counter()
        for start in range(0, messages, TX_BATCH):
            for _ in range(min(TX_BATCH, messages - start)):
                channel.basic_publish("", queue, payload, properties, mandatory=True)
            channel.tx_commit()
        consumed = consumer_channel.consume(queue, inactivity_timeout=30)
        for received, (method, _, _) in enumerate(consumed, start=1):
            assert method is not None, "raw pika consumer timed out"
            if received % 100 == 0 or received == messages:
                consumer_channel.basic_ack(method.delivery_tag, multiple=True)
            if received == messages:
                break
        consumer_channel.cancel()
        return messages / (time.perf_counter() - began)
    finally:
        channel.queue_delete(queue)
        connection.close()


def problem(service: str) -> str | None:
    """Why ``service`` cannot be used, or None."""
    try:
        if service == "postgresql":
            import psycopg

            psycopg.connect(POSTGRES_URL, connect_timeout=5).close()
        elif service == "rabbitmq":
            import pika

            pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)).close()
    except Exception as error:  # any failure to connect is a reason to skip
        return f"{service} unreachable: {error}"
    return None


SHORT_NAMES = {
    "raw sql queue / SQLite": "raw-sqlite",
    "raw sql queue / PostgreSQL": "raw-pg",
    "raw amqp": "raw-amqp",
    "sql queue / SQLite | SQLite": "sqlite",
    "p2p: SQLite inbound each | SQLite": "p2p",
    "sql queue / PostgreSQL | PostgreSQL": "sql-pg",
    "amqp | SQLite": "amqp-sqlite",
    "amqp | PostgreSQL": "amqp-pg",
}
"""What ``--only`` calls each configuration."""
COUNTED_NODE = Path(__file__).resolve().parent / "counted_node.py"


def counted_launcher(workdir: Path) -> Callable[[str], list[str]]:
    """Run each node under :mod:`benchmarks.counted_node`, its counts in ``workdir``."""

    def launch(short: str) -> list[str]:
        return [sys.executable, str(COUNTED_NODE), str(workdir / f"{short}.counts.json")]

    return launch


def take_readings(phase: str, pids: list[int]) -> None:
    """Ask each node (benchmarks/counted_node.py) for a reading of its counters."""
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    time.sleep(0.2)  # (the readings are written by the nodes' main threads, between rounds)


def per_flow_counts(workdir: Path, flows: int) -> dict[str, float]:
    """What both nodes counted between the flows' start and end, per flow."""
    total: dict[str, float] = {}
    for path in sorted(workdir.glob("*.counts.readings")):
        readings = [json.loads(line) for line in path.read_text().splitlines()]
        if len(readings) < 2:
            raise SystemExit(f"{path}: {len(readings)} readings, expected a start and an end")
        start, end = readings[0], readings[-1]

        def spent(key: str, start: dict[str, Any] = start, end: dict[str, Any] = end) -> Any:
            if isinstance(end[key], dict):
                return {k: v - start[key].get(k, 0) for k, v in end[key].items()}
            return end[key] - start[key]

        for key in ("statements", "commits"):
            for database, value in spent(key).items():
                name = f"{database} {key}"
                total[name] = total.get(name, 0) + value
        total["pg round trips"] = total.get("pg round trips", 0) + sum(
            spent("round_trips").values()
        )
        waits = spent("amqp_waits")
        publishing = sum(n for thread, n in waits.items() if thread != "amqp")  # not consuming
        total["amqp waits"] = total.get("amqp waits", 0) + publishing
        total["amqp acks"] = total.get("amqp acks", 0) + spent("amqp_acks")
        total["cpu ms"] = total.get("cpu ms", 0) + spent("cpu_seconds") * 1000
    return {name: value / flows for name, value in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=2000, help="for the raw transports")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(SHORT_NAMES.values()),
        help="run only this configuration (repeatable)",
    )
    args = parser.parse_args()
    down = {s: problem(s) for s in ("postgresql", "rabbitmq")}
    workroot = Path(tempfile.mkdtemp(prefix="fiberflow-bench-"))
    print(f"{args.flows} ping/pong flows per configuration, two node processes each; ")
    print(f"raw transports move {args.messages} messages; work files in {workroot}")

    def wanted(name: str) -> bool:
        return not args.only or SHORT_NAMES[name] in args.only

    raw: dict[str, Callable[[], float]] = {
        "sql queue / SQLite": lambda: raw_sql(f"sqlite:///{workroot / 'raw.db'}", args.messages),
        "sql queue / PostgreSQL": lambda: raw_sql(POSTGRES_URL, args.messages),
        "amqp": lambda: raw_pika(RABBITMQ_URL, args.messages),
    }
    needs = {"sql queue / PostgreSQL": "postgresql", "amqp": "rabbitmq"}
    raw_rates: dict[str, float] = {}
    if any(wanted(f"raw {name}") for name in raw):
        print(f"\nraw transports, used well (batches of {RAW_BATCH} per SQL commit; AMQP in ")
        print(f"transactions of {TX_BATCH}, acks with multiple=True)")
    for name, measure in raw.items():
        if not wanted(f"raw {name}"):
            continue
        service = needs.get(name)
        if service and down[service]:
            print(f"  {name:<24} skipped: {down[service]}")
            continue
        raw_rates[name] = measure()
        print(f"  {name:<24} {raw_rates[name]:9,.0f} messages/s")

    def sqlite_queue(directory: Path) -> str:
        return f"sqlite:///{directory / 'queue.db'}"

    def postgres_queue(_: Path) -> str:
        return POSTGRES_URL

    def rabbitmq(_: Path) -> str:
        return RABBITMQ_URL

    configs: list[tuple[str, str, Callable[[Path], str], str | None]] = [
        ("sql queue / SQLite", "SQLite", sqlite_queue, None),
        ("p2p: SQLite inbound each", "SQLite", sqlite_queue, None),
        ("sql queue / PostgreSQL", "PostgreSQL", postgres_queue, POSTGRES_URL),
        ("amqp", "SQLite", rabbitmq, None),
        ("amqp", "PostgreSQL", rabbitmq, POSTGRES_URL),
    ]
    print("\nfiberflow ping/pong (two node processes)")
    header = (
        f"  {'transport':<24} {'database':<11} {'flows/s':>9} {'msgs/s':>9} {'x raw':>7} "
        f"{'commits':>8} {'stmts':>7} {'q cmts':>7} {'q stmts':>8} {'pg rt':>7} {'amqp w':>7} "
        f"{'acks':>6} {'cpu ms':>7}"
    )
    print(header)
    for transport_name, database_name, transport_url, database_url in configs:
        if not wanted(f"{transport_name} | {database_name}"):
            continue
        missing = [
            down[s]
            for s, used in (
                ("postgresql", "PostgreSQL" in (transport_name + database_name)),
                ("rabbitmq", transport_name == "amqp"),
            )
            if used and down[s]
        ]
        if missing:
            print(f"  {transport_name:<24} {database_name:<11} skipped: {missing[0]}")
            continue
        workdir = workroot / f"{transport_name}-{database_name}".replace(" / ", "-").replace(
            " ", "_"
        )
        workdir.mkdir()
        run = run_pingpong_processes(
            args.flows,
            workdir,
            transport_url(workdir),
            database_url,
            show_progress=False,
            topology="p2p" if transport_name.startswith("p2p") else "shared",
            launcher=counted_launcher(workdir),
            on_phase=take_readings,
        )
        if not run.ok:
            raise SystemExit(f"{transport_name}/{database_name}: flows or nodes failed: {run}")
        flows_per_second = args.flows / run.seconds
        messages_per_second = run.messages_sent / run.seconds
        base = raw_rates.get(
            transport_name.replace("p2p: SQLite inbound each", "sql queue / SQLite")
        )
        ratio = f"{messages_per_second / base:7.2f}" if base else "      -"
        counts = per_flow_counts(workdir, args.flows)
        print(
            f"  {transport_name:<24} {database_name:<11} {flows_per_second:9,.0f} "
            f"{messages_per_second:9,.0f} {ratio} {counts.get('node commits', 0):8.2f} "
            f"{counts.get('node statements', 0):7.2f} {counts.get('queue commits', 0):7.2f} "
            f"{counts.get('queue statements', 0):8.2f} "
            f"{counts['pg round trips']:7.2f} {counts['amqp waits']:7.2f} "
            f"{counts['amqp acks']:6.2f} {counts['cpu ms']:7.2f}"
        )
    print(
        f"\n'x raw' = fiberflow session messages/s (~{MESSAGES_PER_FLOW} per flow) over the raw"
        " transport's messages/s on the same service (above 1: batching and group commit win)."
    )
    print(
        "Per flow, both nodes together, counted inside the node processes between the flows' "
        "request and their last outcome\n(they do not depend on load, but batch sizes do): "
        "'commits' and 'stmts' on the node databases, 'q cmts' and\n'q stmts' on the SQL queue, "
        "'pg rt' PostgreSQL round trips, 'amqp w' waits for the RabbitMQ broker while\n"
        "publishing, 'acks' AMQP ack frames, 'cpu ms' CPU time of both processes (idle polling "
        "included)."
    )


if __name__ == "__main__":
    main()
