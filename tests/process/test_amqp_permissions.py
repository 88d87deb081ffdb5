"""Per-node RabbitMQ users: a node may publish to other nodes' inbound queues (through the
``p2p.inbound`` exchange) and consume only its own queue; nothing else.

Uses ``rabbitmqctl`` to create the users with the commands ``fiberflow amqp-setup`` prints
(the ones docs/security.md tells operators to run), on the default vhost and on a vhost the
test creates (the commands and the printed URL carry the admin URL's vhost).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

from flows.cli.main import main
from messaging.service import Message
from tests.conftest import PIKA_MISSING, RABBITMQ_URL, rabbitmq_problem, require_service

pytest.importorskip("pika", reason=PIKA_MISSING)  # before the imports that need it

import pika

from messaging.amqp import (
    AmqpMessaging,
    dead_letter_queue_name,
    delete_queues,
    inject_raw,
    queue_name,
    read_dead_letters,
)

TOPIC = "permissions.topic"


def rabbitmqctl(command: str) -> None:
    subprocess.run(shlex.split(command), check=True, capture_output=True, timeout=120)


def on_vhost(url: str, vhost: str) -> str:
    """``url`` on ``vhost`` (percent-encoded in the path)."""
    return urlunsplit(urlsplit(url)._replace(path="/" + quote(vhost, safe="")))


@pytest.fixture(params=["default", "own"], ids=["default-vhost", "own-vhost"])
def admin_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """An administrator's URL: the test broker's own, or on a vhost made for the test."""
    require_service("RabbitMQ", rabbitmq_problem())
    require_service(
        "rabbitmqctl", None if shutil.which("rabbitmqctl") else "rabbitmqctl is not on PATH"
    )
    if request.param == "default":
        yield RABBITMQ_URL
        return
    vhost = f"ff/vhost {uuid.uuid4().hex[:8]}"  # a '/' and a space: both percent-encoded
    admin = urlsplit(RABBITMQ_URL).username or "guest"
    subprocess.run(["rabbitmqctl", "add_vhost", vhost], check=True, capture_output=True)
    try:
        subprocess.run(
            ["rabbitmqctl", "set_permissions", "-p", vhost, admin, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
        )
        yield on_vhost(RABBITMQ_URL, vhost)
    finally:
        subprocess.run(["rabbitmqctl", "delete_vhost", vhost], capture_output=True, timeout=120)


def amqp_setup(
    admin_url: str, nodes: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> list[str]:
    """What ``fiberflow amqp-setup`` prints for ``nodes`` (name -> user), line by line."""
    capsys.readouterr()
    arguments = [item for name, user in nodes.items() for item in ("--node", f"{name}={user}")]
    assert main(["amqp-setup", "--admin-url", admin_url, *arguments]) == 0
    return capsys.readouterr().out.splitlines()


@pytest.fixture
def nodes(admin_url: str, capsys: pytest.CaptureFixture[str]) -> Iterator[dict[str, str]]:
    """Two node names mapped to their restricted broker URLs, set up as amqp-setup says."""
    tag = uuid.uuid4().hex[:8]
    names = {
        f"O=Alice {tag},L=London,C=GB": f"ff-alice-{tag}",
        f"O=Bob {tag},L=Paris,C=FR": f"ff-bob-{tag}",
    }
    printed = amqp_setup(admin_url, names, capsys)
    commands = [line for line in printed if line.startswith("rabbitmqctl ")]
    assert len(commands) == 2 * len(names)
    (advice,) = [line for line in printed if line.startswith("# then use ")]
    template = advice.removeprefix("# then use ").split(" ")[0]
    urls = {}
    for name, user in names.items():
        for command in commands:
            if f"'{user}'" in command:
                rabbitmqctl(command.replace("<password>", "secret-" + tag))
        urls[name] = template.replace("USER", user).replace("PASSWORD", "secret-" + tag)
    try:
        yield urls
    finally:
        for name, user in names.items():
            rabbitmqctl(f"rabbitmqctl delete_user '{user}'")
            delete_queues(admin_url, name)


def test_amqp_setup_prints_commands_and_a_url_on_the_admin_urls_vhost(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The printed lines alone (no broker: the topology set-up is left out)."""
    import messaging.amqp

    monkeypatch.setattr(messaging.amqp, "setup_topology", lambda *_: None)
    names = {"O=Alice,L=London,C=GB": "alice"}
    url = "amqp://admin:pw@broker.example:5673/team%2Fa?heartbeat=5"
    printed = amqp_setup(url, names, capsys)
    assert "rabbitmqctl add_user 'alice' '<password>'" in printed
    (granting,) = [line for line in printed if "set_permissions" in line]
    assert granting.startswith("rabbitmqctl set_permissions -p 'team/a' 'alice' '^$' ")
    assert printed[-1] == (
        "# then use amqp://USER:PASSWORD@broker.example:5673/team%2Fa?declare=false as each "
        "transport_url"
    )


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
def test_restricted_nodes_still_exchange_messages_and_dead_letter(
    admin_url: str, nodes: dict[str, str]
) -> None:
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
        inject_raw(admin_url, bob, b"garbage, dead-lettered through p2p.deadletter")
        sender.send(Message("M-1", TOPIC, alice, b"hello"), bob)
        assert arrived.wait(30)
        assert [m.data for m in received] == [b"hello"]
        for _ in range(300):
            if read_dead_letters(admin_url, bob):
                break
            arrived.wait(0.1)
        ((_, reason),) = read_dead_letters(admin_url, bob)
        assert "undecodable frame" in reason
    finally:
        receiver.stop()
        sender.stop()
