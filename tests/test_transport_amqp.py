"""The conformance suite on the AMQP transport (RabbitMQ)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from messaging.service import MessagingService
from tests.conftest import PIKA_MISSING, RABBITMQ_URL, rabbitmq_problem, require_service
from tests.messaging_conformance import TransportConformance

pytest.importorskip("pika", reason=PIKA_MISSING)  # before the imports that need it

from messaging import amqp
from messaging.amqp import AmqpMessaging


class AmqpHarness:
    def __init__(self, url: str) -> None:
        self.url = url
        self.endpoints: list[AmqpMessaging] = []

    def endpoint(self, address: str, max_frame_bytes: int | None = None) -> MessagingService:
        limits = {} if max_frame_bytes is None else {"max_frame_bytes": max_frame_bytes}
        # default prefetch: above the suite's 400
        endpoint = AmqpMessaging(self.url, address, **limits)
        self.endpoints.append(endpoint)
        return endpoint

    def pump(self) -> None:
        time.sleep(0.005)

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
