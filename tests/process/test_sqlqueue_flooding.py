"""The SQL queue under flooding: claims by bytes, oversized rows never loaded, a window.

On SQLite and PostgreSQL (issue 12, item 5):

* a claim reads candidate ids and frame lengths first and leases a prefix within its byte
  budget (always at least one row within the frame limit);
* a row over the frame limit is dead-lettered with a reason naming its size and the limit,
  without its frame entering the consumer's process: a consumer in a subprocess meets a
  300 MiB row and its peak resident set must stay within 100 MiB of what it was before it
  started consuming (loading the row would add at least 300 MiB);
* the consumer holds at most ``window`` deliveries and about ``window_bytes`` unacknowledged
  and claims again only once acknowledgements make room.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from messaging.frame import MAX_FRAME_BYTES, encode_frame
from messaging.service import Message
from messaging.sqlqueue import SqlQueueBroker, SqlQueueMessaging
from statemachine.limits import DEAD_LETTER_PREFIX_BYTES
from tests.flood_consumer import TOPIC

WAIT_SECONDS = 60.0
HUGE_BYTES = 300 * 1024 * 1024
PEAK_GROWTH_BOUND_KIB = 100 * 1024
"""How much the consumer's resident set may grow while it meets the 300 MiB row."""
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def queue_url(tmp_path: Path, backend: str) -> str:
    return f"sqlite:///{tmp_path / 'queue.db'}" if backend == "sqlite" else backend


@pytest.fixture
def broker(queue_url: str) -> Iterator[SqlQueueBroker]:
    broker = SqlQueueBroker(queue_url)
    yield broker
    broker.close()


@pytest.fixture
def queue(broker: SqlQueueBroker) -> Iterator[str]:
    name = f"O=Flood {uuid.uuid4().hex[:10]},L=Test,C=GB"
    broker.create_queue(name)
    yield name
    broker.purge(name)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_SECONDS} s waiting for {what}")
        time.sleep(0.005)


def message(n: int, size: int = 0) -> Message:
    return Message(f"M-{uuid.uuid4().hex}-{n}", TOPIC, "O=Sender,L=Test,C=GB", b"p" * size)


def test_a_claim_takes_a_prefix_within_its_byte_budget(broker: SqlQueueBroker, queue: str) -> None:
    for size in (100, 100, 100, 5000, 100):
        broker.insert_raw(queue, b"f" * size)
    first = broker.claim(queue, "me", 200, 60.0, max_bytes=250)
    assert [len(frame) for _, frame in first.rows] == [100, 100]
    second = broker.claim(queue, "me", 200, 60.0, max_bytes=250)
    assert [len(frame) for _, frame in second.rows] == [100]  # 5000 would not fit with it
    third = broker.claim(queue, "me", 200, 60.0, max_bytes=250)
    assert [len(frame) for _, frame in third.rows] == [5000]  # alone: at least one row
    assert broker.claim(queue, "me", 1, 60.0).rows[0][1] == b"f" * 100  # by count too
    assert broker.claim(queue, "me", 200, 60.0).rows == ()
    assert first.dead_lettered == second.dead_lettered == third.dead_lettered == 0


def test_a_claim_dead_letters_rows_over_the_frame_limit(broker: SqlQueueBroker, queue: str) -> None:
    broker.insert_raw(queue, b"small")
    broker.insert_raw(queue, b"B" * 200_000)
    broker.insert_raw(queue, b"after")
    claim = broker.claim(queue, "me", 200, 60.0, max_frame_bytes=100_000)
    assert [frame for _, frame in claim.rows] == [b"small", b"after"]
    assert claim.dead_lettered == 1 and broker.depth(queue) == 2
    ((size, reason),) = broker.dead_letter_summaries(queue)
    assert reason.startswith("frame of 200000 bytes exceeds the limit of 100000 bytes")
    if broker.dialect == "postgresql":
        assert size == 200_000  # moved whole inside the database
    else:
        assert size == DEAD_LETTER_PREFIX_BYTES  # a bounded prefix, read by blob I/O
        assert f"only its first {DEAD_LETTER_PREFIX_BYTES} bytes are kept" in reason
        ((frame, _),) = broker.dead_letters(queue)
        assert frame == b"B" * DEAD_LETTER_PREFIX_BYTES


def insert_huge_row(broker: SqlQueueBroker, queue: str, size: int) -> None:
    """A row of ``size`` bytes, made by the database itself (the test never holds it)."""
    if broker.dialect == "postgresql":
        frame = "convert_to(repeat('x', :size), 'UTF8')"
    else:
        frame = "zeroblob(:size)"
    statement = text(
        "INSERT INTO ff_queue_messages (queue, message_id, frame, enqueued_at, deliveries) "
        f"VALUES (:queue, 'huge', {frame}, 0, 0)"
    )
    with broker.engine.begin() as connection:
        connection.execute(statement, {"queue": queue, "size": size})


def test_a_300_mib_row_is_dead_lettered_without_being_loaded(
    broker: SqlQueueBroker, queue: str, queue_url: str
) -> None:
    insert_huge_row(broker, queue, HUGE_BYTES)
    after = [message(n) for n in range(3)]
    broker.enqueue([(m, queue) for m in after])
    child = subprocess.run(
        [sys.executable, "-m", "tests.flood_consumer", queue_url, queue, str(len(after))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["finished"], report
    assert sorted(report["delivered"]) == sorted(m.message_id for m in after)
    assert report["dead_lettered"] == 1
    growth = report["peak_kib"] - report["baseline_kib"]
    print(f"consumer RSS: {report}")
    assert growth < PEAK_GROWTH_BOUND_KIB, f"the consumer grew by {growth} KiB: {report}"
    ((_, reason),) = broker.dead_letter_summaries(queue)
    assert reason.startswith(
        f"frame of {HUGE_BYTES} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes"
    )
    assert broker.depth(queue) == 0


class Holding:
    """A handler that keeps what it is given, unacknowledged (a slow scheduler)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list[Message] = []

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.messages.append(message)

    def count(self) -> int:
        with self.lock:
            return len(self.messages)


def test_the_consumer_stops_at_its_window_and_resumes_as_deliveries_are_acknowledged(
    queue_url: str, broker: SqlQueueBroker, queue: str
) -> None:
    sent = [message(n) for n in range(12)]
    broker.enqueue([(m, queue) for m in sent])
    consumer = SqlQueueMessaging(queue_url, queue, synchronous="NORMAL", window=5)
    held = Holding()
    consumer.add_handler(TOPIC, held)
    consumer.start()
    try:
        wait_until(lambda: consumer.window_full.is_set() and held.count() == 5, "a full window")
        assert broker.unclaimed(queue) == 7, "the consumer claimed beyond its window"
        assert consumer.outstanding[0] == 5
        for delivered in held.messages[:3]:
            consumer.acknowledge(delivered)
        wait_until(lambda: consumer.window_full.is_set() and held.count() == 8, "3 more")
        assert broker.unclaimed(queue) == 4
        wait_until(lambda: broker.depth(queue) == 9, "the 3 acknowledged rows deleted")
        for delivered in held.messages[3:8]:
            consumer.acknowledge(delivered)
        wait_until(lambda: held.count() == 12, "the rest")
        assert sorted(m.message_id for m in held.messages) == sorted(m.message_id for m in sent)
    finally:
        consumer.stop()


def test_the_consumer_window_counts_bytes(
    queue_url: str, broker: SqlQueueBroker, queue: str
) -> None:
    sent = [message(n, 1000) for n in range(6)]
    size = len(encode_frame(sent[0]))
    broker.enqueue([(m, queue) for m in sent])
    window_bytes = 2 * size + size // 2  # two fit; the third overshoots by less than a frame
    consumer = SqlQueueMessaging(queue_url, queue, synchronous="NORMAL", window_bytes=window_bytes)
    held = Holding()
    consumer.add_handler(TOPIC, held)
    consumer.start()
    try:
        wait_until(lambda: consumer.window_full.is_set() and held.count() == 3, "a full window")
        assert consumer.outstanding == (3, 3 * size)
        assert 3 * size <= window_bytes + size
        assert broker.unclaimed(queue) == 3
        consumer.acknowledge(held.messages[0])
        wait_until(lambda: consumer.window_full.is_set() and held.count() == 4, "one more")
        assert broker.unclaimed(queue) == 2
    finally:
        consumer.stop()
