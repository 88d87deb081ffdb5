"""Per-node RabbitMQ users: a node may publish to other nodes' inbound queues (through the
``p2p.inbound`` exchange) and consume only its own queue; nothing else.

Uses ``rabbitmqctl`` to create the users with the commands ``permission_commands`` prints
(the ones docs/security.md tells operators to run).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pytest

from messaging.service import Message
from tests.conftest import PIKA_MISSING, RABBITMQ_URL, rabbitmq_problem, require_service

pytest.importorskip("pika", reason=PIKA_MISSING)  # before the imports that need it

import pika

from messaging.amqp import (
    AmqpMessaging,
    dead_letter_queue_name,
    delete_queues,
    inject_raw,
    permission_commands,
    queue_name,
    read_dead_letters,
    setup_topology,
)

TOPIC = "permissions.topic"


def rabbitmqctl(command: str) -> None:
    subprocess.run(shlex.split(command), check=True, capture_output=True, timeout=120)


@pytest.fixture
def nodes() -> Iterator[dict[str, str]]:
    """Two node names mapped to their restricted broker URLs."""
    require_service("RabbitMQ", rabbitmq_problem())
    require_service(
        "rabbitmqctl", None if shutil.which("rabbitmqctl") else "rabbitmqctl is not on PATH"
    )
    tag = uuid.uuid4().hex[:8]
    names = {
        f"O=Alice {tag},L=London,C=GB": f"ff-alice-{tag}",
        f"O=Bob {tag},L=Paris,C=FR": f"ff-bob-{tag}",
    }
    setup_topology(RABBITMQ_URL, list(names))
    urls = {}
    for name, user in names.items():
        for command in permission_commands(name, user, "secret-" + tag):
            rabbitmqctl(command)
        urls[name] = f"amqp://{user}:secret-{tag}@127.0.0.1:5672/%2F?declare=false"
    try:
        yield urls
    finally:
        for name, user in names.items():
            rabbitmqctl(f"rabbitmqctl delete_user '{user}'")
            delete_queues(RABBITMQ_URL, name)


def refused(url: str, operation: str, target: str) -> bool:
    """True if the broker refuses ``operation`` on ``target`` with ACCESS_REFUSED (403)."""
    connection = pika.BlockingConnection(pika.URLParameters(url.split("?")[0]))
    channel = connection.channel()
    try:
        if operation == "consume":
            channel.basic_get(target)
        elif operation == "publish-default":
            channel.confirm_delivery()
            channel.basic_publish("", target, b"x", mandatory=True)
        elif operation == "bind":
            channel.queue_bind(target, "p2p.inbound", routing_key="p2p.inbound.stolen")
        elif operation == "declare":
            channel.queue_declare(target, durable=True)
        return False
    except pika.exceptions.ChannelClosedByBroker as error:
        return error.reply_code == 403
    finally:
        if connection.is_open:
            connection.close()


@pytest.mark.slow
def test_a_node_reads_only_its_own_queue_and_publishes_only_through_the_exchange(
    nodes: dict[str, str],
) -> None:
    (alice, alice_url), (bob, _) = nodes.items()
    assert refused(alice_url, "consume", queue_name(bob))
    assert refused(alice_url, "consume", dead_letter_queue_name(bob))
    assert refused(alice_url, "publish-default", queue_name(bob))
    assert refused(alice_url, "bind", queue_name(alice))
    assert refused(alice_url, "declare", "p2p.inbound.anything")
    assert not refused(alice_url, "consume", queue_name(alice))


@pytest.mark.slow
def test_restricted_nodes_still_exchange_messages_and_dead_letter(nodes: dict[str, str]) -> None:
    (alice, alice_url), (bob, bob_url) = nodes.items()
    sender = AmqpMessaging(alice_url, alice)
    receiver = AmqpMessaging(bob_url, bob)
    received: list[Message] = []
    arrived = threading.Event()

    def on_message(message: Message) -> None:
        received.append(message)
        receiver.acknowledge(message)
        arrived.set()

    receiver.add_handler(TOPIC, on_message)
    receiver.start()
    try:
        inject_raw(RABBITMQ_URL, bob, b"garbage, dead-lettered through p2p.deadletter")
        sender.send(Message("M-1", TOPIC, alice, b"hello"), bob)
        assert arrived.wait(30)
        assert [m.data for m in received] == [b"hello"]
        for _ in range(300):
            if read_dead_letters(RABBITMQ_URL, bob):
                break
            arrived.wait(0.1)
        ((_, reason),) = read_dead_letters(RABBITMQ_URL, bob)
        assert "undecodable frame" in reason
    finally:
        receiver.stop()
        sender.stop()
