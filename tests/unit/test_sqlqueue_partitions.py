"""The SQL queue routes each message to a partition of its target's flows; a consumer of some
partitions takes only theirs (the workers of a node run by several workers).

On SQLite and on PostgreSQL; each PostgreSQL case uses a queue name of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, select, text

from messaging.frame import encode_frame
from messaging.service import Message
from messaging.sqlqueue.broker import SqlQueueBroker
from messaging.sqlqueue.consumer import SqlQueueMessaging
from messaging.sqlqueue.tables import queue_messages
from statemachine.partitions import PARTITIONS, partition_of, partition_of_message
from statemachine.session_ids import (
    identity_tag,
    initiator_session_id,
    message_id,
    responder_flow_id,
)
from tests.waiting import wait_until

SENDER = "O=Sender,L=Paris,C=FR"
TOPIC = "test.topic"


@pytest.fixture
def queue_url(backend: str, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'queue.db'}"
    return backend  # (the PostgreSQL URL)


@pytest.fixture
def queue() -> str:
    return f"O=Receiver {uuid.uuid4().hex[:8]},L=London,C=GB"


def session_message(index: int, sequence: int = 0) -> Message:
    """A message opening session ``index`` of a fresh flow of SENDER (for its responder)."""
    session = initiator_session_id(uuid.uuid4().hex, index, identity_tag(SENDER))
    return Message(message_id(session, sequence), TOPIC, SENDER, b"body")


def messages_by_partition(count: int) -> dict[int, list[Message]]:
    found: dict[int, list[Message]] = {}
    for n in range(count):
        message = session_message(n)
        found.setdefault(partition_of_message(message.message_id, SENDER), []).append(message)
    return found


@pytest.fixture
def consumers(queue_url: str, queue: str) -> Iterator[list[SqlQueueMessaging]]:
    made: list[SqlQueueMessaging] = []
    yield made
    for consumer in made:
        consumer.stop()
    broker = SqlQueueBroker(queue_url)
    broker.purge(queue)
    broker.close()


def consumer_of(
    url: str, queue: str, partitions: frozenset[int] | None, made: list[SqlQueueMessaging]
) -> tuple[SqlQueueMessaging, list[Message]]:
    consumer = SqlQueueMessaging(url, queue, consumer_id=uuid.uuid4().hex)
    got: list[Message] = []
    consumer.add_handler(TOPIC, got.append)
    consumer.consume_partitions(partitions)
    made.append(consumer)
    return consumer, got


def test_a_send_stores_the_partition_of_the_target_flow(queue_url: str, queue: str) -> None:
    broker = SqlQueueBroker(queue_url)
    try:
        broker.create_queue(queue)
        message = session_message(0)
        broker.enqueue([(message, queue)])
        session = message.message_id[2:].rsplit("-", 1)[0]
        with broker.engine.connect() as connection:
            stored = connection.execute(
                select(queue_messages.c.partition).where(queue_messages.c.queue == queue)
            ).scalar_one()
        assert stored == partition_of(responder_flow_id(SENDER, session))
    finally:
        broker.purge(queue)
        broker.close()


def test_consumers_of_disjoint_partitions_share_a_queue_each_taking_only_its_own(
    queue_url: str, queue: str, consumers: list[SqlQueueMessaging]
) -> None:
    evens = frozenset(range(0, PARTITIONS, 2))
    odds = frozenset(range(1, PARTITIONS, 2))
    first, got_first = consumer_of(queue_url, queue, evens, consumers)
    second, got_second = consumer_of(queue_url, queue, odds, consumers)
    by_partition = messages_by_partition(200)
    first.start()
    second.start()
    first.send_batch([(m, queue) for ms in by_partition.values() for m in ms])
    wait_until(lambda: len(got_first) + len(got_second) == 200, "every message delivered", 60)
    assert {partition_of_message(m.message_id, SENDER) for m in got_first} <= evens
    assert {partition_of_message(m.message_id, SENDER) for m in got_second} <= odds
    ids = [m.message_id for m in got_first + got_second]
    assert len(ids) == len(set(ids)) == 200
    assert first.rerouted == second.rerouted == 0  # every row was claimed by its owner


def test_a_delivery_given_back_after_a_hand_over_reaches_the_new_holder(
    queue_url: str, queue: str, consumers: list[SqlQueueMessaging]
) -> None:
    every = frozenset(range(PARTITIONS))
    old, got_old = consumer_of(queue_url, queue, every, consumers)
    new, got_new = consumer_of(queue_url, queue, frozenset(), consumers)
    old.start()
    new.start()
    message = session_message(7)
    partition = partition_of_message(message.message_id, SENDER)
    old.send(message, queue)
    wait_until(lambda: len(got_old) == 1, "the delivery to the old holder", 30)
    # The hand-over: the old holder stops taking the partition, gives back what it holds of
    # it, and the new holder starts taking it.
    old.consume_partitions(every - {partition})
    old.release(got_old[0])
    new.consume_partitions(frozenset({partition}))
    wait_until(lambda: len(got_new) == 1, "the delivery to the new holder", 30)
    assert got_new[0].message_id == message.message_id
    new.acknowledge(got_new[0])
    wait_until(lambda: new.broker.depth(queue) == 0, "the row deleted", 30)
    assert len(got_old) == 1


def test_a_claim_of_a_partition_handed_over_meanwhile_is_routed_on_not_delivered(
    queue_url: str, queue: str, consumers: list[SqlQueueMessaging]
) -> None:
    """Rows claimed before a hand-over (or written without a partition by an older sender)
    go back to their partition's consumer; the handler never sees them."""
    every = frozenset(range(PARTITIONS))
    taker, got_taker = consumer_of(queue_url, queue, frozenset({0}), consumers)
    owners: dict[int, list[Message]] = {}
    for partition in range(1, PARTITIONS):
        _, got = consumer_of(queue_url, queue, frozenset({partition}), consumers)
        owners[partition] = got
    broker = consumers[0].broker
    messages = [m for ms in messages_by_partition(60).values() for m in ms]
    broker.create_queue(queue)
    for message in messages:  # as an older sender wrote them: no partition
        broker.insert_raw(queue, encode_frame(message))
    taker.start()
    for consumer in consumers[1:]:
        consumer.start()
    wait_until(
        lambda: len(got_taker) + sum(len(got) for got in owners.values()) == len(messages),
        "every unrouted message delivered to its partition's consumer",
        60,
    )
    assert all(partition_of_message(m.message_id, SENDER) == 0 for m in got_taker)
    for partition, got in owners.items():
        assert all(partition_of_message(m.message_id, SENDER) == partition for m in got)
    assert taker.rerouted == sum(len(got) for got in owners.values())
    assert every  # (every partition had a consumer)


def test_a_consumer_of_every_partition_takes_unrouted_rows_without_rerouting(
    queue_url: str, queue: str, consumers: list[SqlQueueMessaging]
) -> None:
    consumer, got = consumer_of(queue_url, queue, None, consumers)
    consumer.broker.create_queue(queue)
    consumer.broker.insert_raw(queue, encode_frame(session_message(1)))
    consumer.send(session_message(2), queue)
    consumer.start()
    wait_until(lambda: len(got) == 2, "both delivered", 30)
    assert consumer.rerouted == 0


def test_queue_tables_of_an_older_version_get_the_partition_column(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old-queue.db'}"
    engine = create_engine(url)
    with engine.begin() as connection:  # the table as versions before partitions made it
        connection.execute(
            text(
                "CREATE TABLE ff_queue_messages (id INTEGER PRIMARY KEY, queue VARCHAR(300) "
                "NOT NULL, message_id VARCHAR(250), frame BLOB NOT NULL, enqueued_at BIGINT "
                "NOT NULL, lease_owner VARCHAR(64), lease_until BIGINT, deliveries INTEGER "
                "NOT NULL)"
            )
        )
    engine.dispose()
    broker = SqlQueueBroker(url)
    try:
        columns = {c["name"] for c in inspect(broker.engine).get_columns("ff_queue_messages")}
        assert "partition" in columns
        broker.create_queue("O=Q,L=L,C=GB")
        broker.enqueue([(session_message(0), "O=Q,L=L,C=GB")])
        claim = broker.claim("O=Q,L=L,C=GB", "me", 10, 60.0, partitions=frozenset(range(16)))
        assert len(claim.rows) == 1
    finally:
        broker.close()
