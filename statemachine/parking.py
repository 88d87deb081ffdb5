"""Messages held unacknowledged until their session opens (or their kept flow is dealt with).

A message for a session that no flow owns yet (its initial message has not been taken in:
messages can arrive out of order) waits here, within bounds, and is dead-lettered if the
session does not open in time. Messages for a flow kept in the hospital whose checkpoint
could not be read (so its sessions are unknown) wait here too, without a time limit, until
an operator retries the flow or kills it.
"""

from __future__ import annotations

from collections.abc import Callable

from statemachine.ports import InboundMessage

MAX_PARKED_PER_SESSION = 64
"""Messages held for one session that has not opened yet."""
MAX_PARKED = 1_000
"""Messages held in all for sessions not open yet. Held messages are unacknowledged: on AMQP
each takes a slot of the consumer's prefetch window (``messaging.amqp.DEFAULT_PREFETCH``,
2,000), so this stays well below it and parked messages can never starve the node."""
PARKED_TIMEOUT_SECONDS = 600.0
"""Messages for a session that has not opened after this long are dead-lettered."""


class ParkingLot:
    """Parked messages by session (see the module docstring)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._parked: dict[str, list[InboundMessage]] = {}
        self._total = 0
        self._since: dict[str, float] = {}  # session id -> first parked (expiring ones)
        self._held_for: dict[str, set[str]] = {}  # kept flow id -> session ids held for it

    def park(self, message: InboundMessage, session_id: str, *, expires: bool) -> bool:
        """Hold ``message`` for ``session_id``; False if over the bounds (not parked)."""
        if len(self._parked.get(session_id, ())) >= MAX_PARKED_PER_SESSION:
            return False
        if self._total >= MAX_PARKED:
            return False
        self._parked.setdefault(session_id, []).append(message)
        self._total += 1
        if expires:
            self._since.setdefault(session_id, self._now())
        return True

    def hold_for(self, flow_id: str, session_id: str) -> None:
        """``session_id``'s parked messages are held for kept flow ``flow_id``."""
        self._held_for.setdefault(flow_id, set()).add(session_id)

    def release(self, session_id: str) -> list[InboundMessage]:
        """The session opened: its parked messages, to be routed again."""
        self._since.pop(session_id, None)
        released = self._parked.pop(session_id, [])
        self._total -= len(released)
        return released

    def release_held(self, flow_id: str) -> list[InboundMessage]:
        """What was held for kept flow ``flow_id`` (it is retried, or it ended)."""
        released: list[InboundMessage] = []
        for session_id in self._held_for.pop(flow_id, set()):
            released.extend(self.release(session_id))
        return released

    def forget_held(self, flow_id: str) -> None:
        """Stop holding for ``flow_id`` (its sessions are known again: they release)."""
        self._held_for.pop(flow_id, None)

    def expired(self) -> list[tuple[str, InboundMessage]]:
        """Messages whose session did not open within the timeout, taken off the lot."""
        if not self._since:
            return []
        cutoff = self._now() - PARKED_TIMEOUT_SECONDS
        found: list[tuple[str, InboundMessage]] = []
        for session_id in [s for s, since in self._since.items() if since <= cutoff]:
            found.extend((session_id, m) for m in self.release(session_id))
        return found

    def next_expiry(self) -> float | None:
        """When the earliest parked session times out, or None."""
        return min(self._since.values()) + PARKED_TIMEOUT_SECONDS if self._since else None

    def count(self) -> int:
        """Messages parked now."""
        return self._total
