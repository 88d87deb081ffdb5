"""RabbitMQ routes each message to its partition's queue; a consumer of some partitions takes
only theirs (the workers of a node run by several workers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from messaging.frame import encode_frame
from messaging.service import Message
from statemachine.partitions import PARTITIONS, partition_of_message
from tests.conftest import RABBITMQ_URL, rabbitmq_problem, require_service
from tests.unit.test_sqlqueue_partitions import (
    SENDER,
    TOPIC,
    messages_by_partition,
    session_message,
)
from tests.waiting import wait_until

pytest.importorskip("pika", reason="the AMQP transport needs pika (pip install 'fiberflow[amqp]')")

from messaging.amqp import delete_queues, inject_raw
from messaging.amqp.consumer import AmqpMessaging


@pytest.fixture
def address() -> Iterator[str]:
    require_service("RabbitMQ", rabbitmq_problem())
    name = f"O=Receiver {uuid.uuid4().hex[:8]},L=London,C=GB"
    yield name
    delete_queues(RABBITMQ_URL, name)


@pytest.fixture
def consumers() -> Iterator[list[AmqpMessaging]]:
    made: list[AmqpMessaging] = []
    yield made
    for consumer in made:
        consumer.stop()


def consumer_of(
    address: str, partitions: frozenset[int] | None, made: list[AmqpMessaging]
) -> tuple[AmqpMessaging, list[Message]]:
    consumer = AmqpMessaging(RABBITMQ_URL, address, consumer_id=uuid.uuid4().hex)
    got: list[Message] = []
    consumer.add_handler(TOPIC, got.append)
    consumer.consume_partitions(partitions)
    made.append(consumer)
    return consumer, got


def partition(message: Message) -> int:
    return partition_of_message(message.message_id, SENDER)


def test_consumers_of_disjoint_partitions_each_take_only_their_own(
    address: str, consumers: list[AmqpMessaging]
) -> None:
    evens = frozenset(range(0, PARTITIONS, 2))
    odds = frozenset(range(1, PARTITIONS, 2))
    first, got_first = consumer_of(address, evens, consumers)
    second, got_second = consumer_of(address, odds, consumers)
    first.start()
    second.start()
    first.send_batch([(m, address) for ms in messages_by_partition(200).values() for m in ms])
    wait_until(lambda: len(got_first) + len(got_second) == 200, "every message delivered", 60)
    assert {partition(m) for m in got_first} <= evens
    assert {partition(m) for m in got_second} <= odds
    assert len({m.message_id for m in got_first + got_second}) == 200
    assert first.forwarded == second.forwarded == 0  # each was published to its own queue


def test_a_delivery_given_back_after_a_hand_over_reaches_the_new_holder(
    address: str, consumers: list[AmqpMessaging]
) -> None:
    every = frozenset(range(PARTITIONS))
    old, got_old = consumer_of(address, every, consumers)
    new, got_new = consumer_of(address, frozenset(), consumers)
    old.start()
    new.start()
    message = session_message(7)
    old.send(message, address)
    wait_until(lambda: len(got_old) == 1, "the delivery to the old holder", 30)
    old.consume_partitions(every - {partition(message)})
    new.consume_partitions(frozenset({partition(message)}))
    old.release(got_old[0])  # back to its queue, which only the new holder consumes now
    wait_until(lambda: len(got_new) == 1, "the delivery to the new holder", 30)
    assert got_new[0].message_id == message.message_id and len(got_old) == 1


def test_messages_in_the_queue_from_before_partitions_are_forwarded_to_their_own(
    address: str, consumers: list[AmqpMessaging]
) -> None:
    """The holder of partition 0 consumes the old queue and forwards what is not its own."""
    taker, got_taker = consumer_of(address, frozenset({0}), consumers)
    rest, got_rest = consumer_of(address, frozenset(range(1, PARTITIONS)), consumers)
    messages = [m for ms in messages_by_partition(60).values() for m in ms]
    for message in messages:  # as an older sender published them: to the one inbound queue
        inject_raw(RABBITMQ_URL, address, encode_frame(message))
    taker.start()
    rest.start()
    wait_until(lambda: len(got_taker) + len(got_rest) == len(messages), "every message", 60)
    # the taker counts a forward once the broker confirmed it, which can be just after the
    # other consumer already took the message in: let its count catch up, then compare
    wait_until(lambda: taker.forwarded >= len(got_rest), "the taker to count its forwards", 60)
    assert all(partition(m) == 0 for m in got_taker)
    assert all(partition(m) != 0 for m in got_rest)
    assert taker.forwarded == len(got_rest)
