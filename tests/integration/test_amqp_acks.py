"""AMQP acknowledgements: one ``multiple`` ack for a settled run, never a held delivery."""

from __future__ import annotations

import uuid

import pytest

from messaging.amqp.consumer import SettledTags
from messaging.service import Message
from tests.conftest import PIKA_MISSING, RABBITMQ_URL, rabbitmq_problem, require_service
from tests.waiting import wait_until


def test_a_settled_run_is_one_multiple_ack() -> None:
    settled = SettledTags()
    assert settled.acks_for([2, 1, 3]) == [(3, True)]
    assert settled.acks_for([5]) == [(5, False)]  # 4 is still held: 5 alone
    assert settled.acks_for([6]) == [(6, False)]
    assert settled.acks_for([4]) == [(4, True)]  # covers 4 only: 5 and 6 were acked alone
    assert settled.floor == 6
    assert settled.acks_for([]) == []


def test_a_multiple_ack_never_names_a_tag_acked_alone() -> None:
    settled = SettledTags()
    settled.acked_alone(2)  # a dead letter, acked on its own
    assert settled.acks_for([3]) == [(3, False)]
    assert settled.acks_for([1]) == [(1, True)]  # the run 1..3: only 1 is outstanding
    settled.acked_alone(4)
    assert settled.floor == 4
    assert settled.acks_for([6]) == [(6, False)]
    settled.acked_alone(5)
    assert settled.floor == 6  # nothing left outstanding below 7: no ack needed
    assert settled.acks_for([7]) == [(7, True)]


def test_held_deliveries_come_back_and_settled_ones_do_not() -> None:
    require_service("RabbitMQ", rabbitmq_problem())
    pytest.importorskip("pika", reason=PIKA_MISSING)
    from messaging import amqp
    from messaging.amqp import AmqpMessaging

    address = f"O=Acks{uuid.uuid4().hex[:8]},L=London,C=GB"
    sender = AmqpMessaging(RABBITMQ_URL, f"O=Sender{uuid.uuid4().hex[:8]},L=Paris,C=FR")
    consumer = AmqpMessaging(RABBITMQ_URL, address)
    got: list[Message] = []
    consumer.add_handler("test.topic", got.append)
    try:
        consumer.start()
        sender.send_batch(
            [
                (Message(f"m-{n}", "test.topic", "O=Sender,L=Paris,C=FR", b"x"), address)
                for n in range(3)
            ]
        )
        amqp.inject_raw(RABBITMQ_URL, address, b"not a frame")  # dead-lettered, acked alone
        sender.send_batch(
            [
                (Message(f"m-{n}", "test.topic", "O=Sender,L=Paris,C=FR", b"x"), address)
                for n in range(3, 6)
            ]
        )
        wait_until(lambda: len(got) == 6, "six deliveries", 30)
        held = got[1]
        for message in reversed(got):  # out of order; m-1 is held
            if message is not held:
                consumer.acknowledge(message)
        wait_until(lambda: consumer.pending_acknowledgements == 0, "the acks to be sent", 30)
        consumer.stop()
        assert consumer.reconnects == 0  # no ack the broker refused (that closes the channel)
        again: list[Message] = []
        second = AmqpMessaging(RABBITMQ_URL, address)
        second.add_handler("test.topic", again.append)
        second.start()
        try:
            wait_until(lambda: len(again) == 1, "the held delivery again", 30)
            assert [m.message_id for m in again] == [held.message_id]
            assert len(amqp.read_dead_letters(RABBITMQ_URL, address)) == 1
        finally:
            second.stop()
    finally:
        consumer.stop()
        sender.stop()
        amqp.delete_queues(RABBITMQ_URL, address)
        amqp.delete_queues(RABBITMQ_URL, sender.my_address)
