"""The conformance suite on the SQL queue: SQLite (a shared file) and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from messaging.service import MessagingService
from messaging.sqlqueue import SqlQueueBroker, SqlQueueMessaging
from tests.conftest import POSTGRES_URL, postgres_problem, require_service
from tests.messaging_conformance import TransportConformance


class SqlQueueHarness:
    def __init__(self, url: str) -> None:
        self.url = url
        self.broker = SqlQueueBroker(url)
        self.addresses: set[str] = set()

    def endpoint(self, address: str, max_frame_bytes: int | None = None) -> MessagingService:
        self.addresses.add(address)
        limits = {} if max_frame_bytes is None else {"max_frame_bytes": max_frame_bytes}
        return SqlQueueMessaging(self.url, address, synchronous="NORMAL", **limits)

    def pump(self) -> None:
        time.sleep(0.005)

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
