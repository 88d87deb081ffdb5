"""The conformance suite on the in-memory network (the test double)."""

from __future__ import annotations

import pytest

from messaging.inmemory import InMemoryMessaging, InMemoryNetwork
from messaging.service import MessagingService
from tests.messaging_conformance import TransportConformance


class InMemoryHarness:
    def __init__(self) -> None:
        self.network = InMemoryNetwork(seed=1)
        self.addresses: list[str] = []

    def endpoint(self, address: str, max_frame_bytes: int | None = None) -> MessagingService:
        self.addresses.append(address)
        if max_frame_bytes is not None:  # one network: its limit is every endpoint's
            self.network.max_frame_bytes = max_frame_bytes
        return self.network.endpoint(address)

    def deliver(self) -> bool:
        """Deliver what is queued for every endpoint; whether anything was taken off a queue."""
        statistics = self.network.statistics
        before = statistics.delivered + statistics.dead_lettered
        for address in set(self.addresses):
            self.network.deliver(address)
        return statistics.delivered + statistics.dead_lettered != before

    def drain(self, endpoint: MessagingService) -> None:
        """Deliver until nothing moves; then the endpoint's queue must be empty."""
        while self.deliver():
            pass
        left = self.network.pending(endpoint.my_address)
        assert left == 0, f"{left} messages stay queued for {endpoint.my_address}"

    def flush_acknowledgements(self, endpoint: MessagingService) -> None:
        """Nothing to wait for: the network applies an acknowledgement at once."""

    def crash(self, endpoint: MessagingService) -> None:
        assert isinstance(endpoint, InMemoryMessaging)
        endpoint.stop()  # the network keeps the queue: a stop loses what a crash loses

    def inject_raw(self, address: str, raw: bytes) -> None:
        self.network.inject_raw(address, raw)

    def dead_letter_reasons(self, address: str) -> list[str]:
        return [d.reason for d in self.network.dead_letters if d.address == address]


class TestInMemoryNetwork(TransportConformance):
    @pytest.fixture
    def harness(self) -> InMemoryHarness:
        return InMemoryHarness()
