"""The conformance suite every ``MessagingService`` must pass.

A backend's test file subclasses :class:`TransportConformance` and provides a ``harness``
fixture (a :class:`TransportHarness`). The suite checks the contract written in
``messaging/service.py``: send and receive, acknowledgement, redelivery after a consumer
dies, durability across a consumer restart, no loss under concurrent producers, and
dead-lettering, with the reason, of frames that cannot be decoded, of bodies over the frame
limit (refused on their length, before decoding), of text fields over their limits (exactly
the limit passes) and of messages whose topic has no handler.

No test sleeps for a fixed time. Every wait is a condition with a deadline that names what it
waited for (:func:`wait_until`); the in-memory network is driven step by step, so a wait on it
fails at once when nothing is left to deliver. Before asserting that something did *not*
arrive, a test has the harness prove that the endpoint was given everything its queue held
(:meth:`TransportHarness.drain`), and before crashing an endpoint it has the harness prove
that its acknowledgements were written (:meth:`TransportHarness.flush_acknowledgements`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import msgpack
import pytest

from messaging.frame import FRAME_VERSION, encode_frame
from messaging.service import Message, MessagingService, TransportError
from statemachine.limits import MESSAGE_ID_CHARS, PARTY_NAME_CHARS, TOPIC_CHARS

TOPIC = "conformance.topic"
WAIT_SECONDS = 30.0
"""How long a wait may take before it fails, naming what it waited for."""
POLL_SECONDS = 0.005
"""How often a wait on a transport with consumer threads checks its condition again."""


class TransportHarness(Protocol):
    """What the suite needs from a backend."""

    def endpoint(self, address: str, max_frame_bytes: int | None = None) -> MessagingService:
        """A new, not yet started service for ``address`` (its queue exists afterwards).

        With ``max_frame_bytes``, it takes no larger frame (the default limit otherwise).
        """

    def deliver(self) -> bool:
        """Drive the deliveries a test must drive; False when nothing more can happen by itself.

        The in-memory network delivers only when told: it delivers what is queued and answers
        whether anything was delivered or dead-lettered. Transports with consumer threads
        deliver by themselves and answer True.
        """

    def drain(self, endpoint: MessagingService) -> None:
        """Return once ``endpoint``'s handlers were given everything its queue holds now.

        After it, "this message never came" is an observation, not a guess. Each harness
        proves it its own way and fails, naming the endpoint, if it cannot.
        """

    def flush_acknowledgements(self, endpoint: MessagingService) -> None:
        """Return once every acknowledgement given to ``endpoint`` is written through.

        (So that a crash right after it loses none of them.)
        """

    def crash(self, endpoint: MessagingService) -> None:
        """Make ``endpoint`` die as a killed process would (no clean shutdown)."""

    def inject_raw(self, address: str, raw: bytes) -> None:
        """Put raw bytes on ``address``'s queue, bypassing the sender's framing."""

    def dead_letter_reasons(self, address: str) -> list[str]:
        """The reasons recorded for ``address``'s dead letters, oldest first."""


class Inbox:
    """A handler that records what it is given (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages: list[Message] = []

    def __call__(self, message: Message) -> None:
        with self._lock:
            self.messages.append(message)

    def ids(self) -> list[str]:
        with self._lock:
            return [m.message_id for m in self.messages]


def wait_until(harness: TransportHarness, condition: Callable[[], bool], what: str) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` when it cannot or did not in time.

    On the in-memory network it fails as soon as nothing is left to deliver; on a transport
    with consumer threads it checks again every :data:`POLL_SECONDS` until
    :data:`WAIT_SECONDS` have passed.
    """
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if not harness.deliver():
            if condition():
                return
            raise AssertionError(f"no {what}: the transport has nothing left to deliver")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_SECONDS:.0f} s waiting for {what}")
        time.sleep(POLL_SECONDS)


def address(role: str) -> str:
    return f"O=Conformance {role} {uuid.uuid4().hex[:10]},L=Test,C=GB"


def message(sender: str, n: int, data: bytes | None = None) -> Message:
    return Message(f"M-{uuid.uuid4().hex}-{n}", TOPIC, sender, data or f"payload {n}".encode())


def consumer(harness: TransportHarness, name: str) -> tuple[MessagingService, Inbox]:
    service = harness.endpoint(name)
    inbox = Inbox()
    service.add_handler(TOPIC, inbox)
    service.start()
    return service, inbox


def successor(
    harness: TransportHarness, dead: MessagingService, name: str
) -> tuple[MessagingService, Inbox]:
    """A consumer for ``name`` started by the process that took over from ``dead``.

    It is told the dead consumer's id (as a node is, by its lease), so it gets what the dead
    one held at once rather than when the transport's own leases on it expire.
    """
    service = harness.endpoint(name)
    inbox = Inbox()
    service.add_handler(TOPIC, inbox)
    service.release_deliveries_of([dead.consumer_id])
    service.start()
    return service, inbox


class TransportConformance:
    """Subclass with a ``harness`` fixture to run the suite on a transport."""

    def test_send_and_receive_keep_every_field(self, harness: TransportHarness) -> None:
        sender_name, receiver_name = address("A"), address("B")
        sender = harness.endpoint(sender_name)
        sender.start()
        receiver, inbox = consumer(harness, receiver_name)
        sent = [message(sender_name, n) for n in range(20)]
        sent.append(message(sender_name, 20, bytes(range(256)) * 4))
        for m in sent:
            sender.send(m, receiver_name)
        wait_until(harness, lambda: set(inbox.ids()) >= {m.message_id for m in sent}, "20 msgs")
        by_id = {m.message_id: m for m in inbox.messages}
        assert all(by_id[m.message_id] == m for m in sent)
        assert sender.my_address == sender_name and receiver.my_address == receiver_name
        receiver.stop()
        sender.stop()

    def test_send_batch_delivers_every_message(self, harness: TransportHarness) -> None:
        sender_name, first_name, second_name = address("A"), address("B"), address("C")
        sender = harness.endpoint(sender_name)
        sender.start()
        first, first_inbox = consumer(harness, first_name)
        second, second_inbox = consumer(harness, second_name)
        batch = [(message(sender_name, n), (first_name, second_name)[n % 2]) for n in range(30)]
        sender.send_batch(batch)
        wait_until(
            harness,
            lambda: len(set(first_inbox.ids())) == 15 and len(set(second_inbox.ids())) == 15,
            "both targets' messages",
        )
        assert set(first_inbox.ids()) == {m.message_id for m, t in batch if t == first_name}
        for service in (first, second, sender):
            service.stop()

    def test_acknowledged_messages_are_not_delivered_again(self, harness: TransportHarness) -> None:
        sender_name, receiver_name = address("A"), address("B")
        sender = harness.endpoint(sender_name)
        sender.start()
        receiver, inbox = consumer(harness, receiver_name)
        sent = [message(sender_name, n) for n in range(5)]
        for m in sent:
            sender.send(m, receiver_name)
        wait_until(harness, lambda: len(set(inbox.ids())) == 5, "5 messages")
        for delivered in list(inbox.messages):
            receiver.acknowledge(delivered)
        receiver.stop()
        again, again_inbox = consumer(harness, receiver_name)
        marker = message(sender_name, 99)
        sender.send(marker, receiver_name)
        wait_until(harness, lambda: marker.message_id in again_inbox.ids(), "the marker")
        harness.drain(again)
        assert again_inbox.ids() == [marker.message_id]
        again.stop()
        sender.stop()

    def test_acknowledging_one_copy_leaves_another_with_the_same_id(
        self, harness: TransportHarness
    ) -> None:
        # A hostile copy carrying a genuine message's id, dead-lettered and acknowledged by the
        # node, must not take the genuine copy with it: acknowledgement is per delivery.
        sender_name, forger_name, receiver_name = address("A"), address("F"), address("B")
        sender, forger = harness.endpoint(sender_name), harness.endpoint(forger_name)
        sender.start()
        forger.start()
        receiver, inbox = consumer(harness, receiver_name)
        genuine = message(sender_name, 1)
        forged = Message(genuine.message_id, TOPIC, forger_name, b"forged")
        forger.send(forged, receiver_name)
        sender.send(genuine, receiver_name)
        wait_until(harness, lambda: len(inbox.ids()) == 2, "both copies")
        (bad,) = [m for m in inbox.messages if m.sender == forger_name]
        receiver.acknowledge(bad)
        harness.flush_acknowledgements(receiver)  # a transport may buffer acknowledgements
        harness.crash(receiver)  # the genuine copy was never acknowledged: it comes back
        again, again_inbox = successor(harness, receiver, receiver_name)
        wait_until(harness, lambda: len(again_inbox.ids()) >= 1, "the genuine copy")
        harness.drain(again)
        assert [(m.sender, m.data) for m in again_inbox.messages] == [(sender_name, genuine.data)]
        for delivered in list(again_inbox.messages):
            again.acknowledge(delivered)
        for service in (again, sender, forger):
            service.stop()

    def test_unacknowledged_messages_are_redelivered_after_the_consumer_dies(
        self, harness: TransportHarness
    ) -> None:
        sender_name, receiver_name = address("A"), address("B")
        sender = harness.endpoint(sender_name)
        sender.start()
        receiver, inbox = consumer(harness, receiver_name)
        sent = [message(sender_name, n) for n in range(5)]
        for m in sent:
            sender.send(m, receiver_name)
        wait_until(harness, lambda: len(set(inbox.ids())) == 5, "5 messages")
        harness.crash(receiver)
        again, again_inbox = successor(harness, receiver, receiver_name)
        wait_until(harness, lambda: len(set(again_inbox.ids())) == 5, "the 5 redelivered")
        assert set(again_inbox.ids()) == {m.message_id for m in sent}
        for delivered in list(again_inbox.messages):
            again.acknowledge(delivered)
        again.stop()
        sender.stop()

    def test_messages_sent_while_the_consumer_is_down_survive_its_restart(
        self, harness: TransportHarness
    ) -> None:
        sender_name, receiver_name = address("A"), address("B")
        sender = harness.endpoint(sender_name)
        sender.start()
        receiver, _ = consumer(harness, receiver_name)
        receiver.stop()
        sent = [message(sender_name, n) for n in range(10)]
        for m in sent:
            sender.send(m, receiver_name)
        again, inbox = consumer(harness, receiver_name)
        wait_until(harness, lambda: len(set(inbox.ids())) == 10, "10 messages after restart")
        assert set(inbox.ids()) == {m.message_id for m in sent}
        again.stop()
        sender.stop()

    def test_concurrent_producers_lose_nothing(self, harness: TransportHarness) -> None:
        receiver_name = address("B")
        receiver, inbox = consumer(harness, receiver_name)
        producers = [harness.endpoint(address(f"P{i}")) for i in range(4)]
        expected: set[str] = set()
        errors: list[BaseException] = []
        lock = threading.Lock()

        def produce(producer: MessagingService) -> None:
            try:
                for n in range(0, 100, 10):
                    batch = [message(producer.my_address, n + k) for k in range(10)]
                    with lock:
                        expected.update(m.message_id for m in batch)
                    if n % 20 == 0:
                        producer.send_batch([(m, receiver_name) for m in batch])
                    else:
                        for m in batch:
                            producer.send(m, receiver_name)
            except BaseException as error:
                errors.append(error)

        for producer in producers:
            producer.start()
        threads = [threading.Thread(target=produce, args=(p,)) for p in producers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert len(expected) == 400
        wait_until(harness, lambda: set(inbox.ids()) >= expected, "400 messages")
        assert set(inbox.ids()) == expected
        receiver.stop()
        for producer in producers:
            producer.stop()

    def test_undecodable_frames_are_dead_lettered_with_the_reason(
        self, harness: TransportHarness
    ) -> None:
        sender_name, receiver_name = address("A"), address("B")
        sender = harness.endpoint(sender_name)
        sender.start()
        receiver, inbox = consumer(harness, receiver_name)
        good_frame = encode_frame(message(sender_name, 1))
        garbage = [
            b"\xc1 definitely not msgpack",
            good_frame[: len(good_frame) // 2],
            msgpack.packb([1, 2, 3]),
        ]
        for raw in garbage:
            harness.inject_raw(receiver_name, raw)
        good = message(sender_name, 2)
        sender.send(good, receiver_name)
        wait_until(harness, lambda: good.message_id in inbox.ids(), "the good message")
        wait_until(
            harness,
            lambda: len(harness.dead_letter_reasons(receiver_name)) == 3,
            "3 dead letters",
        )
        assert inbox.ids() == [good.message_id]
        reasons = harness.dead_letter_reasons(receiver_name)
        assert all("undecodable frame" in reason for reason in reasons), reasons
        receiver.acknowledge(inbox.messages[0])
        receiver.stop()
        # Dead letters are not delivered again, and the queue keeps working.
        again, again_inbox = consumer(harness, receiver_name)
        after = message(sender_name, 3)
        sender.send(after, receiver_name)
        wait_until(harness, lambda: after.message_id in again_inbox.ids(), "a later message")
        harness.drain(again)
        assert again_inbox.ids() == [after.message_id]
        assert len(harness.dead_letter_reasons(receiver_name)) == 3
        again.stop()
        sender.stop()

    def test_sending_to_an_address_without_a_queue_is_a_transport_error(
        self, harness: TransportHarness
    ) -> None:
        sender_name = address("A")
        sender = harness.endpoint(sender_name)
        sender.start()
        with pytest.raises(TransportError):
            sender.send(message(sender_name, 1), address("Nobody"))
        sender.stop()

    def test_a_body_over_the_frame_limit_is_dead_lettered_before_decoding(
        self, harness: TransportHarness
    ) -> None:
        limit = 100_000
        sender_name, receiver_name = address("A"), address("B")
        sender = harness.endpoint(sender_name)
        sender.start()
        receiver = harness.endpoint(receiver_name, max_frame_bytes=limit)
        inbox = Inbox()
        receiver.add_handler(TOPIC, inbox)
        receiver.start()
        framed = encode_frame(message(sender_name, 1, b"x" * limit))  # a good frame, too big
        garbage = b"\xc1" * (limit + 1)  # not msgpack: decoding it would say "undecodable"
        harness.inject_raw(receiver_name, framed)
        harness.inject_raw(receiver_name, garbage)
        within = message(sender_name, 2, b"y" * (limit - 1000))
        sender.send(within, receiver_name)
        wait_until(harness, lambda: within.message_id in inbox.ids(), "the message within")
        wait_until(
            harness, lambda: len(harness.dead_letter_reasons(receiver_name)) == 2, "2 dead letters"
        )
        reasons = sorted(harness.dead_letter_reasons(receiver_name))
        assert reasons[0].startswith(f"frame of {len(garbage)} bytes exceeds the limit of {limit}")
        assert reasons[1].startswith(f"frame of {len(framed)} bytes exceeds the limit of {limit}")
        assert inbox.ids() == [within.message_id]
        receiver.acknowledge(inbox.messages[0])
        receiver.stop()
        sender.stop()

    def test_text_fields_are_taken_up_to_their_limits_and_refused_beyond(
        self, harness: TransportHarness
    ) -> None:
        sender_name, receiver_name = address("A"), address("B")
        long_topic = "t\u00e9" * (TOPIC_CHARS // 2)  # two-byte characters: the limit counts
        receiver = harness.endpoint(receiver_name)  # characters, as PostgreSQL's varchar does
        sender = harness.endpoint(sender_name)
        sender.start()
        inbox = Inbox()
        receiver.add_handler(TOPIC, inbox)
        receiver.add_handler(long_topic, inbox)
        receiver.start()

        def raw(message_id: str, topic: str, sender: str) -> bytes:
            fields = [FRAME_VERSION, message_id, topic, sender, b"data", b""]
            return bytes(msgpack.packb(fields, use_bin_type=True))

        def padded(prefix: str, length: int) -> str:
            return (prefix + "\u00e9" * length)[:length]

        at_limit = [
            (padded(f"M-{uuid.uuid4().hex}-", MESSAGE_ID_CHARS), TOPIC, sender_name),
            (f"M-{uuid.uuid4().hex}", long_topic, sender_name),
            (f"M-{uuid.uuid4().hex}", TOPIC, padded(sender_name, PARTY_NAME_CHARS)),
        ]
        over = [
            (padded("M-over-", MESSAGE_ID_CHARS + 1), TOPIC, sender_name, "message_id"),
            ("M-over-topic", long_topic + "x", sender_name, "topic"),
            ("M-over-sender", TOPIC, padded(sender_name, PARTY_NAME_CHARS + 1), "sender"),
            ("M-nul\x00", TOPIC, sender_name, "message_id"),
        ]
        for message_id, topic, claimed in at_limit:  # sent: a sender takes them too
            sender.send(Message(message_id, topic, claimed, b"data"), receiver_name)
        for message_id, topic, claimed, _ in over:  # written by a sender that checks nothing
            harness.inject_raw(receiver_name, raw(message_id, topic, claimed))
        wait_until(harness, lambda: len(inbox.ids()) == 3, "the 3 messages at the limits")
        wait_until(
            harness,
            lambda: len(harness.dead_letter_reasons(receiver_name)) == len(over),
            f"{len(over)} dead letters",
        )
        assert sorted(inbox.ids()) == sorted(m for m, _, _ in at_limit)
        reasons = " | ".join(harness.dead_letter_reasons(receiver_name))
        for field, limit in (
            ("message_id", MESSAGE_ID_CHARS),
            ("topic", TOPIC_CHARS),
            ("sender", PARTY_NAME_CHARS),
        ):
            assert f"field {field} has {limit + 1} characters; the limit is {limit}" in reasons
        assert "field message_id contains a NUL character" in reasons
        for delivered in list(inbox.messages):
            receiver.acknowledge(delivered)
        receiver.stop()
        sender.stop()

    def test_unknown_topics_are_dead_lettered_with_the_reason(
        self, harness: TransportHarness
    ) -> None:
        sender_name, receiver_name = address("A"), address("B")
        sender = harness.endpoint(sender_name)
        sender.start()
        receiver, inbox = consumer(harness, receiver_name)
        stray = Message(f"M-{uuid.uuid4().hex}", "conformance.nobody", sender_name, b"stray")
        sender.send(stray, receiver_name)
        good = message(sender_name, 1)
        sender.send(good, receiver_name)
        wait_until(harness, lambda: good.message_id in inbox.ids(), "the good message")
        wait_until(
            harness, lambda: len(harness.dead_letter_reasons(receiver_name)) == 1, "a dead letter"
        )
        (reason,) = harness.dead_letter_reasons(receiver_name)
        assert f"no handler for topic 'conformance.nobody' at {receiver_name}" in reason
        assert inbox.ids() == [good.message_id]
        receiver.acknowledge(inbox.messages[0])
        receiver.stop()
        # Dead-lettered means settled: a restarted consumer does not see the stray again.
        again, again_inbox = consumer(harness, receiver_name)
        after = message(sender_name, 2)
        sender.send(after, receiver_name)
        wait_until(harness, lambda: after.message_id in again_inbox.ids(), "a later message")
        harness.drain(again)
        assert again_inbox.ids() == [after.message_id]
        assert len(harness.dead_letter_reasons(receiver_name)) == 1
        again.stop()
        sender.stop()
