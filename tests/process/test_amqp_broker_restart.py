"""Restarting RabbitMQ mid-run loses nothing: every message sent is delivered and acknowledged.

A producer thread sends 200 messages, retrying each refused send as the outbox relay would,
while the test stops and starts the broker's application with ``rabbitmqctl``. The consumer
reconnects by itself; what it had not acknowledged when the broker went down is redelivered.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import uuid

import pytest

from messaging.service import Message, TransportError
from tests.conftest import PIKA_MISSING, RABBITMQ_URL, rabbitmq_problem, require_service
from tests.waiting import wait_until

pytest.importorskip("pika", reason=PIKA_MISSING)  # before the imports that need it

from messaging import amqp
from messaging.amqp import AmqpMessaging

TOPIC = "restart.topic"
MESSAGES = 200
BEFORE_OUTAGE = 50
"""Messages taken before the broker is stopped."""
AFTER_RESTART = 50
"""Messages kept back until the broker is up again (the rest are sent during the outage)."""
OUTAGE_SECONDS = 2.0
DEADLINE_SECONDS = 120.0
RABBITMQCTL_TIMEOUT_SECONDS = 120.0


def rabbitmqctl(*args: str) -> None:
    subprocess.run(
        ["rabbitmqctl", *args], check=True, timeout=RABBITMQCTL_TIMEOUT_SECONDS, capture_output=True
    )


def restart_broker() -> None:
    """Stop the RabbitMQ application for a while; whatever happens, start it again."""
    try:
        rabbitmqctl("stop_app")
        time.sleep(OUTAGE_SECONDS)
    finally:
        rabbitmqctl("start_app")
        rabbitmqctl("await_startup")


class AckingInbox:
    """Records every delivery and acknowledges it at once (thread-safe)."""

    def __init__(self, service: AmqpMessaging) -> None:
        self._service = service
        self._lock = threading.Lock()
        self.deliveries: list[str] = []

    def __call__(self, message: Message) -> None:
        with self._lock:
            self.deliveries.append(message.message_id)
        self._service.acknowledge(message)

    def ids(self) -> set[str]:
        with self._lock:
            return set(self.deliveries)

    def count(self) -> int:
        with self._lock:
            return len(self.deliveries)


class Producer(threading.Thread):
    """Sends every message in three phases, retrying a refused send until it is taken."""

    def __init__(self, sender: AmqpMessaging, target: str, messages: list[Message]) -> None:
        super().__init__(name="restart-producer")
        self.sender = sender
        self.target = target
        self.messages = messages
        self.outage = threading.Event()
        self.restarted = threading.Event()
        self.taken = 0
        self.refused = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + DEADLINE_SECONDS
            during = len(self.messages) - AFTER_RESTART
            for n, message in enumerate(self.messages):
                if n == BEFORE_OUTAGE:
                    assert self.outage.wait(DEADLINE_SECONDS), "the outage never began"
                if n == during:
                    assert self.restarted.wait(DEADLINE_SECONDS), "the broker never came back"
                self.send_until_taken(message, deadline)
                if BEFORE_OUTAGE <= n < during:
                    time.sleep(0.05)  # spread these over the outage
        except BaseException as error:
            self.error = error

    def send_until_taken(self, message: Message, deadline: float) -> None:
        while True:
            try:
                self.sender.send(message, self.target)
                self.taken += 1
                return
            except TransportError:
                self.refused += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.mark.slow
def test_a_broker_restart_mid_run_loses_nothing() -> None:
    require_service("RabbitMQ", rabbitmq_problem())
    require_service(
        "rabbitmqctl",
        None
        if shutil.which("rabbitmqctl")
        else "rabbitmqctl is not on PATH (it restarts the broker)",
    )
    run = uuid.uuid4().hex[:10]
    sender_name = f"O=Restart Sender {run},L=Test,C=GB"
    receiver_name = f"O=Restart Receiver {run},L=Test,C=GB"
    receiver = AmqpMessaging(RABBITMQ_URL, receiver_name)
    sender = AmqpMessaging(RABBITMQ_URL, sender_name, reconnect_timeout=1.0)
    inbox = AckingInbox(receiver)
    receiver.add_handler(TOPIC, inbox)
    messages = [
        Message(f"M-{run}-{n}", TOPIC, sender_name, f"payload {n}".encode())
        for n in range(MESSAGES)
    ]
    producer = Producer(sender, receiver_name, messages)
    try:
        receiver.start()
        producer.start()
        wait_until(
            lambda: producer.taken >= BEFORE_OUTAGE,
            "the messages before the outage",
            DEADLINE_SECONDS,
        )
        producer.outage.set()
        restart_broker()
        producer.restarted.set()
        producer.join(DEADLINE_SECONDS)
        assert not producer.is_alive(), "the producer did not finish"
        assert producer.error is None, producer.error
        assert producer.refused > 0, "no send met the outage: the test proved nothing"

        expected = {m.message_id for m in messages}
        wait_until(
            lambda: inbox.ids() >= expected, "every message after the restart", DEADLINE_SECONDS
        )
        assert inbox.ids() == expected
        assert receiver.reconnects >= 1
        # Late redeliveries sit in the queue ahead of a marker sent now: once the marker has
        # come (and been acknowledged, as every delivery is), so have they.
        marker = Message(f"M-{run}-marker", TOPIC, sender_name, b"marker")
        sender.send(marker, receiver_name)
        wait_until(lambda: marker.message_id in inbox.ids(), "the marker", DEADLINE_SECONDS)
        receiver.stop()  # sends the last acks; anything unacknowledged goes back to the queue
        assert amqp.queue_depth(RABBITMQ_URL, receiver_name) == 0, "unacknowledged messages"
    finally:
        producer.outage.set()
        producer.restarted.set()
        if producer.ident is not None:
            producer.join(DEADLINE_SECONDS)
        receiver.stop()
        sender.stop()
        for name in (sender_name, receiver_name):
            amqp.delete_queues(RABBITMQ_URL, name)
