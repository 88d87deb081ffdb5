"""Timers: a flow's durable deadline (a sleep, a receive timeout), and retries after failures.

:class:`WakeUps` keeps one live deadline per flow (a flow waits on one thing at a time: its
latest deadline replaces any earlier one). :class:`RetryQueue` keeps what must be tried again
at a time (a flow to resume from its checkpoint, a message to route again).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class WakeUps:
    """Deadlines by flow; stale heap entries are skipped and compacted away."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str]] = []
        self._deadline_of: dict[str, float] = {}
        self._sequence = 0

    def schedule(self, flow_id: str, deadline: float) -> None:
        """``flow_id`` wakes up at ``deadline`` (replacing any earlier deadline of it)."""
        self._deadline_of[flow_id] = deadline
        self._sequence += 1
        heapq.heappush(self._heap, (deadline, self._sequence, flow_id))
        if len(self._heap) > 2 * len(self._deadline_of) + 1024:
            self._heap = [
                (due, number, owner)
                for due, number, owner in self._heap
                if self._deadline_of.get(owner) == due
            ]
            heapq.heapify(self._heap)

    def forget(self, flow_id: str) -> None:
        """``flow_id`` no longer waits for its deadline."""
        self._deadline_of.pop(flow_id, None)

    def due(self, now: float, live: Callable[[str], bool]) -> list[str]:
        """The flows whose deadline has passed (each taken off); ``live`` says which still run."""
        found = []
        self._drop_stale(live)
        while self._heap and self._heap[0][0] <= now:
            _, _, flow_id = heapq.heappop(self._heap)
            del self._deadline_of[flow_id]
            found.append(flow_id)
            self._drop_stale(live)
        return found

    def next(self, live: Callable[[str], bool]) -> float | None:
        """The earliest live deadline, or None."""
        self._drop_stale(live)
        return self._heap[0][0] if self._heap else None

    def pending(self) -> int:
        """Entries held (live or stale, before compaction): for tests and reports."""
        return len(self._heap)

    def _drop_stale(self, live: Callable[[str], bool]) -> None:
        while self._heap:
            due, _, flow_id = self._heap[0]
            if self._deadline_of.get(flow_id) == due and live(flow_id):
                return
            heapq.heappop(self._heap)


class RetryQueue(Generic[T]):
    """Items to try again, each at its own time."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._sequence = 0

    def push(self, due: float, item: T) -> None:
        """Try ``item`` again at ``due``."""
        self._sequence += 1
        heapq.heappush(self._heap, (due, self._sequence, item))

    def pop_due(self, now: float) -> list[tuple[float, T]]:
        """(due, item) of every item due by ``now``, taken off the queue, earliest first."""
        found = []
        while self._heap and self._heap[0][0] <= now:
            due, _, item = heapq.heappop(self._heap)
            found.append((due, item))
        return found

    def next_due(self) -> float | None:
        """When the earliest item is due, or None."""
        return self._heap[0][0] if self._heap else None
