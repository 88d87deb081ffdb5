"""The conformance suite on the SQL queue: SQLite (a shared file) and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from messaging.service import MessagingService
from messaging.sqlqueue import SqlQueueBroker, SqlQueueMessaging
from tests.conftest import POSTGRES_URL, postgres_problem, require_service
from tests.messaging_conformance import TransportConformance, wait_until


class SqlQueueHarness:
    def __init__(self, url: str) -> None:
        self.url = url
        self.broker = SqlQueueBroker(url)
        self.addresses: set[str] = set()

    def endpoint(self, address: str, max_frame_bytes: int | None = None) -> MessagingService:
        self.addresses.add(address)
        limits = {} if max_frame_bytes is None else {"max_frame_bytes": max_frame_bytes}
        return SqlQueueMessaging(self.url, address, synchronous="NORMAL", **limits)

    def deliver(self) -> bool:
        """The consumer threads deliver by themselves."""
        return True

    def drain(self, endpoint: MessagingService) -> None:
        """Wait until every row of the queue is leased by the endpoint and handed over."""
        assert isinstance(endpoint, SqlQueueMessaging)
        wait_until(self, endpoint.drained, f"everything queued for {endpoint.my_address}")

    def flush_acknowledgements(self, endpoint: MessagingService) -> None:
        """Wait until the consumer thread has deleted the acknowledged rows."""
        assert isinstance(endpoint, SqlQueueMessaging)
        wait_until(
            self,
            lambda: endpoint.pending_acknowledgements == 0,
            f"the acknowledgements of {endpoint.my_address} to be written",
        )

    def crash(self, endpoint: MessagingService) -> None:
        assert isinstance(endpoint, SqlQueueMessaging)
        endpoint.abandon()

    def inject_raw(self, address: str, raw: bytes) -> None:
        self.broker.insert_raw(address, raw)

    def dead_letter_reasons(self, address: str) -> list[str]:
        return [reason for _, reason in self.broker.dead_letter_summaries(address)]

    def close(self) -> None:
        for address in self.addresses:
            self.broker.purge(address)
        self.broker.close()


class TestSqlQueueOnSqlite(TransportConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[SqlQueueHarness]:
        harness = SqlQueueHarness(f"sqlite:///{tmp_path / 'queue.db'}")
        yield harness
        harness.close()


class TestSqlQueueOnPostgres(TransportConformance):
    @pytest.fixture
    def harness(self) -> Iterator[SqlQueueHarness]:
        require_service("PostgreSQL", postgres_problem())
        harness = SqlQueueHarness(POSTGRES_URL)
        yield harness
        harness.close()
