"""The conformance suite on the AMQP transport (RabbitMQ).

Draining uses a marker: RabbitMQ hands a queue to its one consumer in order (a requeued
message goes back to its place, or nearer the head), so once a marker published behind
everything in a node's queue has reached the node, everything before it has too.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Iterator

import pytest

from messaging.frame import encode_frame
from messaging.service import Message, MessagingService
from tests.conftest import PIKA_MISSING, RABBITMQ_URL, rabbitmq_problem, require_service
from tests.messaging_conformance import TransportConformance, wait_until

pytest.importorskip("pika", reason=PIKA_MISSING)  # before the imports that need it

from messaging import amqp
from messaging.amqp import AmqpMessaging

MARKER_TOPIC = "conformance.marker"
"""The topic of the harness's markers (every endpoint takes it: markers are never dead letters)."""


class AmqpHarness:
    def __init__(self, url: str) -> None:
        self.url = url
        self.endpoints: list[AmqpMessaging] = []
        self._markers_lock = threading.Lock()
        self._markers_seen: set[str] = set()

    def endpoint(self, address: str, max_frame_bytes: int | None = None) -> MessagingService:
        limits = {} if max_frame_bytes is None else {"max_frame_bytes": max_frame_bytes}
        # default prefetch: above the suite's 400
        endpoint = AmqpMessaging(self.url, address, **limits)
        endpoint.add_handler(MARKER_TOPIC, functools.partial(self._on_marker, endpoint))
        self.endpoints.append(endpoint)
        return endpoint

    def _on_marker(self, endpoint: AmqpMessaging, marker: Message) -> None:
        with self._markers_lock:
            self._markers_seen.add(marker.message_id)
        endpoint.acknowledge(marker)

    def deliver(self) -> bool:
        """The consumer threads deliver by themselves."""
        return True

    def drain(self, endpoint: MessagingService) -> None:
        """Publish a marker behind everything in the endpoint's queue; wait until it arrives."""
        marker = Message(f"marker-{uuid.uuid4().hex}", MARKER_TOPIC, "O=Harness,L=Test,C=GB", b"")
        amqp.inject_raw(self.url, endpoint.my_address, encode_frame(marker))

        def arrived() -> bool:
            with self._markers_lock:
                return marker.message_id in self._markers_seen

        wait_until(self, arrived, f"a marker behind everything queued for {endpoint.my_address}")

    def flush_acknowledgements(self, endpoint: MessagingService) -> None:
        """Wait until the consumer thread has sent the acknowledgements to the broker."""
        assert isinstance(endpoint, AmqpMessaging)
        wait_until(
            self,
            lambda: endpoint.pending_acknowledgements == 0,
            f"the acknowledgements of {endpoint.my_address} to be sent",
        )

    def crash(self, endpoint: MessagingService) -> None:
        assert isinstance(endpoint, AmqpMessaging)
        endpoint.abandon()

    def inject_raw(self, address: str, raw: bytes) -> None:
        amqp.inject_raw(self.url, address, raw)

    def dead_letter_reasons(self, address: str) -> list[str]:
        return [reason for _, reason in amqp.read_dead_letters(self.url, address)]

    def close(self) -> None:
        for endpoint in self.endpoints:
            endpoint.stop()  # a no-op unless a failed test left it running
        for address in {endpoint.my_address for endpoint in self.endpoints}:
            amqp.delete_queues(self.url, address)


class TestAmqpOnRabbitMQ(TransportConformance):
    @pytest.fixture
    def harness(self) -> Iterator[AmqpHarness]:
        require_service("RabbitMQ", rabbitmq_problem())
        harness = AmqpHarness(RABBITMQ_URL)
        yield harness
        harness.close()
