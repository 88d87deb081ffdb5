"""What the machine allows, measured in the same run as fiberflow: the bounds of issue 14's goals.

* :func:`greenlet_pairs_per_second`: a bare hub of greenlets, one greenlet per flow and one
  per responder, every message packed and unpacked with msgpack, four messages per pair as in
  fiberflow's session protocol (initial with "Ping", confirm, "Pong", end). Nothing durable,
  no checks: the most ping/pong pairs per second the interpreter allows with this design.
* :func:`sqlite_groups_per_second`: raw ``sqlite3`` (WAL, ``synchronous=FULL``), one checkpoint
  group per step (a 1 KB checkpoint upsert, a dedup id, an outbox row), 64 groups per
  transaction: the disk's batched commit rate as fiberflow's writes would use it.

Run alone: ``python benchmarks/bounds.py``; ``benchmarks/pingpong.py`` measures both beside
fiberflow and prints the ratios.
"""

from __future__ import annotations

import collections
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
from greenlet import greenlet

MESSAGES_PER_PAIR = 4
GROUPS_PER_TRANSACTION = 64
CHECKPOINT_BYTES = 1024


def greenlet_pairs_per_second(pairs: int) -> float:
    """Ping/pong pairs per second through a bare greenlet hub (see the module docstring).

    Messages are addressed by number (a flow ``2i``, its responder ``2i + 1``, started by
    the hub when its initial message arrives), packed with msgpack when sent and unpacked
    when received; the hub switches to the addressee with the bytes.
    """
    ready: collections.deque[tuple[int, bytes]] = collections.deque()
    fibers: dict[int, greenlet] = {}
    hub = greenlet.getcurrent()
    finished = 0

    def send(to: int, message: dict[str, Any]) -> None:
        ready.append((to, msgpack.packb(message)))

    def receive() -> dict[str, Any]:
        message: dict[str, Any] = msgpack.unpackb(hub.switch())
        return message

    def responder(first: bytes) -> None:
        initial = msgpack.unpackb(first)
        peer = initial["from"]
        send(peer, {"kind": "confirm", "session": initial["session"], "seq": 0})
        send(peer, {"kind": "data", "session": initial["session"], "seq": 1, "payload": "Pong"})
        end = receive()
        assert end["kind"] == "end"

    def initiator(me: int) -> None:
        nonlocal finished
        send(me + 1, {"kind": "initial", "session": me, "from": me, "payload": "Ping"})
        confirm = receive()
        reply = receive()
        assert confirm["kind"] == "confirm" and reply["payload"] == "Pong"
        send(me + 1, {"kind": "end", "session": me, "seq": 2})
        finished += 1

    began = time.perf_counter()
    for index in range(pairs):
        me = 2 * index
        fibers[me] = greenlet(initiator)
        fibers[me].switch(me)
        while ready:
            to, data = ready.popleft()
            fiber = fibers.get(to)
            if fiber is None:
                fiber = fibers[to] = greenlet(responder)
            fiber.switch(data)
            if fiber.dead:
                del fibers[to]
    elapsed = time.perf_counter() - began
    assert finished == pairs and not fibers, (finished, pairs, len(fibers))
    return pairs / elapsed


def sqlite_groups_per_second(groups: int, directory: str | None = None) -> float:
    """Checkpoint groups per second committed by raw sqlite3 (see the module docstring)."""
    with tempfile.TemporaryDirectory(dir=directory) as work:
        path = os.path.join(work, "bound.db")
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.executescript(
            "CREATE TABLE checkpoints (flow_id TEXT PRIMARY KEY, blob BLOB NOT NULL);"
            "CREATE TABLE dedup (message_id TEXT PRIMARY KEY);"
            "CREATE TABLE outbox (message_id TEXT PRIMARY KEY, payload BLOB NOT NULL);"
        )
        blob = os.urandom(CHECKPOINT_BYTES)
        began = time.perf_counter()
        for first in range(0, groups, GROUPS_PER_TRANSACTION):
            connection.execute("BEGIN")
            for index in range(first, min(first + GROUPS_PER_TRANSACTION, groups)):
                connection.execute(
                    "INSERT INTO checkpoints VALUES (?, ?) "
                    "ON CONFLICT (flow_id) DO UPDATE SET blob = excluded.blob",
                    (f"flow-{index % 1000}", blob),
                )
                connection.execute("INSERT INTO dedup VALUES (?)", (f"in-{index}",))
                connection.execute("INSERT INTO outbox VALUES (?, ?)", (f"out-{index}", blob[:200]))
            connection.execute("COMMIT")
        elapsed = time.perf_counter() - began
        connection.close()
    return groups / elapsed


def main() -> None:
    """Print both bounds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    print(f"greenlet + msgpack hub: {greenlet_pairs_per_second(20_000):,.0f} ping/pong pairs/s")
    print(f"raw sqlite3, FULL, 64 per txn: {sqlite_groups_per_second(20_000):,.0f} groups/s")


if __name__ == "__main__":
    main()
