"""The store conformance suite on the non-durable in-memory store."""

from __future__ import annotations

import pytest

from persistence.memory_store import InMemoryStore
from tests.store_conformance import Store, StoreConformance


class MemoryStoreHarness:
    """Each store is new and empty (nothing survives, nothing is shared)."""

    duplicate_id_error = ValueError

    def open(self) -> Store:
        return InMemoryStore()

    def dead_letters(self, store: Store) -> list[tuple[str, str, str, bytes]]:
        assert isinstance(store, InMemoryStore)
        return [(m.message_id, m.sender, reason, m.data) for m, reason in store.tables.dead_letters]


class TestInMemoryStore(StoreConformance):
    @pytest.fixture
    def harness(self) -> MemoryStoreHarness:
        return MemoryStoreHarness()
