"""Run ``fiberflow`` (a node process) with load-independent counters, for the benchmarks.

``python benchmarks/counted_node.py COUNTS.json node run --config node.toml`` runs the CLI as
usual and, when the process exits, writes to ``COUNTS.json`` what it did, counted from inside
the process (the figures do not depend on how busy the machine was):

* ``statements``: SQL statements (an ``executemany`` counts once) and ``commits``, per database
  (``node`` for the node database, ``queue`` for a SQL queue, by URL);
* ``round_trips``: PostgreSQL round trips (psycopg waits for a reply from the server), per thread;
* ``amqp_waits``: waits for the RabbitMQ broker when publishing (a transaction's commit, or a
  publish in confirm mode), per thread,
  ``amqp_publishes`` and ``amqp_acks`` (ack frames sent);
* ``cpu_seconds``: user + system CPU time of the process.

On ``SIGUSR1`` the process appends a reading of its counters to ``COUNTS.json.readings``
(one JSON document a line): the benchmark takes one when the flows are requested and one
when their outcomes are in, so start-up and shut-down stay out of the figures.

Nothing here is part of fiberflow: it patches counters in from outside, for measuring.
"""

from __future__ import annotations

import atexit
import collections
import json
import resource
import signal
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine, event

from benchmarks.round_trips import counting_wait

COUNTS: dict[str, Any] = {
    "statements": collections.Counter(),
    "commits": collections.Counter(),
    "round_trips": collections.Counter(),
    "amqp_waits": collections.Counter(),
    "amqp_publishes": 0,
    "amqp_acks": 0,
}


def _database(connection: Any) -> str:
    """``node`` for the node database, ``queue`` for a SQL queue's."""
    url = connection.engine.url
    if url.get_backend_name() == "sqlite":
        file_name = Path(url.database or "").name
        return "queue" if "queue" in file_name or "inbound" in file_name else "node"
    translated = connection.get_execution_options().get("schema_translate_map")
    return "node" if translated else "queue"  # the SQL queue has no schema of its own


def _thread() -> str:
    return threading.current_thread().name.split("-")[0]


def install() -> None:
    """Count statements, commits, PostgreSQL round trips and AMQP waits in this process."""

    @event.listens_for(Engine, "before_cursor_execute")
    def _statement(connection: Any, *_: Any) -> None:
        COUNTS["statements"][_database(connection)] += 1

    @event.listens_for(Engine, "commit")
    def _commit(connection: Any) -> None:
        COUNTS["commits"][_database(connection)] += 1

    try:
        import psycopg

        def round_trip(_: Any) -> None:
            COUNTS["round_trips"][_thread()] += 1

        wait = counting_wait(psycopg.Connection.wait, round_trip)
        psycopg.Connection.wait = wait  # type: ignore[method-assign]
    except ImportError:
        pass
    try:
        from pika.adapters import blocking_connection
        from pika.channel import Channel

        blocking = blocking_connection.BlockingChannel
        original_commit = blocking.tx_commit
        original_blocking_publish = blocking.basic_publish
        original_publish = Channel.basic_publish
        original_ack = Channel.basic_ack

        def commit(self: Any, *args: Any, **kwargs: Any) -> Any:
            COUNTS["amqp_waits"][_thread()] += 1  # a transaction's commit waits for the broker
            return original_commit(self, *args, **kwargs)

        def blocking_publish(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self._delivery_confirmation:  # a confirm-mode publish waits for its confirm
                COUNTS["amqp_waits"][_thread()] += 1
            return original_blocking_publish(self, *args, **kwargs)

        def publish(self: Any, *args: Any, **kwargs: Any) -> Any:
            COUNTS["amqp_publishes"] += 1
            return original_publish(self, *args, **kwargs)

        def ack(self: Any, *args: Any, **kwargs: Any) -> Any:
            COUNTS["amqp_acks"] += 1
            return original_ack(self, *args, **kwargs)

        blocking.tx_commit = commit
        blocking.basic_publish = blocking_publish
        Channel.basic_publish = publish
        Channel.basic_ack = ack
    except ImportError:
        pass


def reading() -> str:
    """The counters now, as one line of JSON."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    COUNTS["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    return json.dumps(COUNTS)


def main() -> int:
    """Install the counters, run the CLI with the remaining arguments, write the counts."""
    target = Path(sys.argv[1])
    install()

    def take_reading(*_: Any) -> None:
        with target.with_suffix(".readings").open("a") as readings:
            readings.write(reading() + "\n")

    signal.signal(signal.SIGUSR1, take_reading)
    atexit.register(lambda: target.write_text(reading()))
    from flows.cli.main import main as cli_main

    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
