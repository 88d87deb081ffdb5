"""The AMQP publisher's batches: one transaction per ``TX_BATCH`` messages, refusals named.

A batch is published in AMQP transactions (messaging/amqp/publisher.py): these tests check
what the conformance suite cannot see from outside a transport: a batch larger than one
transaction arrives whole, a message no queue takes fails the batch with the target named
(also when it is not the first of its transaction), a message the broker refuses (a full
queue that rejects publishes) fails it too, the publisher works again afterwards, and a batch
costs one round trip per transaction, not one per message.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import PIKA_MISSING, RABBITMQ_URL, rabbitmq_problem, require_service

pika = pytest.importorskip("pika", reason=PIKA_MISSING)

from messaging.amqp import delete_queues, queue_depth  # noqa: E402
from messaging.amqp.publisher import TX_BATCH, Outgoing, Publisher  # noqa: E402
from messaging.amqp.topology import (  # noqa: E402
    INBOUND_EXCHANGE,
    declare_queues,
    partition_queue_name,
    queue_name,
)
from messaging.service import TransportError  # noqa: E402


def _address(prefix: str) -> str:
    return f"O={prefix}{uuid.uuid4().hex[:8]},L=Test,C=GB"


@pytest.fixture
def channel() -> Iterator[object]:
    """A plain channel to set queues up with; every queue it declared is deleted after."""
    require_service("RabbitMQ", rabbitmq_problem())
    connection = pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL))
    channel = connection.channel()
    channel.declared = []  # type: ignore[attr-defined]
    yield channel
    for address in channel.declared:  # type: ignore[attr-defined]
        delete_queues(RABBITMQ_URL, address)
    connection.close()


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    require_service("RabbitMQ", rabbitmq_problem())
    publisher = Publisher(RABBITMQ_URL, "fiberflow test publisher", reconnect_timeout=5.0)
    yield publisher
    publisher.close()


def _node(channel: object) -> str:
    address = _address("Node")
    declare_queues(channel, address)
    channel.declared.append(address)  # type: ignore[attr-defined]
    return address


def _batch(target: str, count: int, start: int = 0, queue: str | None = None) -> list[Outgoing]:
    """Messages to one queue of ``target`` (its partition 0's unless ``queue`` says)."""
    queue = queue or partition_queue_name(target, 0)
    return [Outgoing(target, f"m{i}".encode(), f"m{i}", queue) for i in range(start, start + count)]


def test_a_batch_over_one_transaction_arrives_whole(channel: object, publisher: Publisher) -> None:
    target = _node(channel)
    publisher.publish(_batch(target, 2 * TX_BATCH + 3))
    assert queue_depth(RABBITMQ_URL, target) == 2 * TX_BATCH + 3


def test_an_unroutable_message_in_a_batch_names_its_target(
    channel: object, publisher: Publisher
) -> None:
    target = _node(channel)
    nobody = _address("Nobody")
    batch = [
        *_batch(target, 2),
        Outgoing(nobody, b"lost", "x", queue_name(nobody)),
        *_batch(target, 2, start=2),
    ]
    with pytest.raises(TransportError, match=f"no queue for {nobody}"):
        publisher.publish(batch)
    publisher.publish(_batch(target, 1, start=10))  # the publisher carries on
    # The routable messages of the refused batch may have been taken (the caller sends them
    # again: receivers drop duplicates); the one after the refusal certainly was.
    assert queue_depth(RABBITMQ_URL, target) >= 1


def test_an_unroutable_message_in_a_later_transaction_is_named(
    channel: object, publisher: Publisher
) -> None:
    target = _node(channel)
    nobody = _address("Nobody")
    batch = [*_batch(target, TX_BATCH + 5), Outgoing(nobody, b"lost", "x", queue_name(nobody))]
    with pytest.raises(TransportError, match=f"no queue for {nobody}"):
        publisher.publish(batch)
    assert queue_depth(RABBITMQ_URL, target) == TX_BATCH + 5


def test_a_message_the_broker_refuses_fails_the_batch(
    channel: object, publisher: Publisher
) -> None:
    full = _address("Full")
    name = queue_name(full)
    arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
    channel.exchange_declare(INBOUND_EXCHANGE, exchange_type="direct", durable=True)  # type: ignore[attr-defined]
    channel.queue_declare(name, durable=True, arguments=arguments)  # type: ignore[attr-defined]
    channel.queue_bind(name, INBOUND_EXCHANGE, routing_key=name)  # type: ignore[attr-defined]
    channel.declared.append(full)  # type: ignore[attr-defined]
    with pytest.raises(TransportError, match=f"refused a message of a batch to {full}"):
        publisher.publish(_batch(full, 3, queue=name))
    target = _node(channel)
    publisher.publish(_batch(target, 2))  # a new channel: the publisher carries on
    assert queue_depth(RABBITMQ_URL, target) == 2


def test_a_batch_costs_one_round_trip_per_transaction(
    channel: object, publisher: Publisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _node(channel)
    publisher.publish(_batch(target, 1))  # connected
    commits = 0
    original = pika.adapters.blocking_connection.BlockingChannel.tx_commit

    def counting_commit(self: object) -> object:
        nonlocal commits
        commits += 1
        return original(self)

    monkeypatch.setattr(
        pika.adapters.blocking_connection.BlockingChannel, "tx_commit", counting_commit
    )
    publisher.publish(_batch(target, TX_BATCH + 1, start=1))
    assert commits == 2
