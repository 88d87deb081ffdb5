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
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Column, Integer, LargeBinary, MetaData, Table, create_engine, select

from flows.demo import run_pingpong_processes
from persistence.engine import configure_sqlite, normalize_url

POSTGRES_URL = os.environ.get(
    "FIBERFLOW_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
RABBITMQ_URL = os.environ.get(
    "FIBERFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"
)
MESSAGES_PER_FLOW = 4


def raw_sql(url: str, messages: int) -> float:
    """Messages per second through a bare table: insert+commit, select, delete+commit."""
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
        for _ in range(messages):
            with engine.begin() as connection:
                connection.execute(table.insert().values(data=payload))
            with engine.begin() as connection:
                row = connection.execute(select(table.c.id).order_by(table.c.id).limit(1)).first()
                assert row is not None
                connection.execute(table.delete().where(table.c.id == row.id))
        return messages / (time.perf_counter() - began)
    finally:
        metadata.drop_all(engine)
        engine.dispose()


def raw_pika(url: str, messages: int) -> float:
    """Messages per second: publish with confirms, then consume with manual acks."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    queue = f"bench.raw.{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    properties = pika.BasicProperties(delivery_mode=2)
    payload = b"x" * 200
    try:
        began = time.perf_counter()
        for _ in range(messages):
            channel.basic_publish("", queue, payload, properties, mandatory=True)
        consumed = channel.consume(queue, inactivity_timeout=30)
        for received, (method, _, _) in enumerate(consumed, start=1):
            assert method is not None, "raw pika consumer timed out"
            channel.basic_ack(method.delivery_tag)
            if received == messages:
                break
        channel.cancel()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=2000, help="for the raw transports")
    args = parser.parse_args()
    down = {s: problem(s) for s in ("postgresql", "rabbitmq")}
    workroot = Path(tempfile.mkdtemp(prefix="fiberflow-bench-"))
    print(f"{args.flows} ping/pong flows per configuration, two node processes each; ")
    print(f"raw transports move {args.messages} messages; work files in {workroot}")

    raw: dict[str, Callable[[], float]] = {
        "sql queue / SQLite": lambda: raw_sql(f"sqlite:///{workroot / 'raw.db'}", args.messages),
        "sql queue / PostgreSQL": lambda: raw_sql(POSTGRES_URL, args.messages),
        "amqp": lambda: raw_pika(RABBITMQ_URL, args.messages),
    }
    needs = {"sql queue / PostgreSQL": "postgresql", "amqp": "rabbitmq"}
    raw_rates: dict[str, float] = {}
    print("\nraw transports")
    for name, measure in raw.items():
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
    header = f"  {'transport':<24} {'database':<11} {'flows/s':>9} {'msgs/s':>9} {'x raw':>7}"
    print(header)
    for transport_name, database_name, transport_url, database_url in configs:
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
        )
        if not run.ok:
            raise SystemExit(f"{transport_name}/{database_name}: flows or nodes failed: {run}")
        flows_per_second = args.flows / run.seconds
        messages_per_second = run.messages_sent / run.seconds
        base = raw_rates.get(
            transport_name.replace("p2p: SQLite inbound each", "sql queue / SQLite")
        )
        ratio = f"{messages_per_second / base:7.2f}" if base else "      -"
        print(
            f"  {transport_name:<24} {database_name:<11} {flows_per_second:9,.0f} "
            f"{messages_per_second:9,.0f} {ratio}"
        )
    print(
        f"\n'x raw' = fiberflow session messages/s (~{MESSAGES_PER_FLOW} per flow) over the raw"
        " transport's messages/s on the same service (above 1: batching and group commit win)."
    )


if __name__ == "__main__":
    main()
