"""Inbound deliveries a scheduler holds unacknowledged, and when each is settled.

Every delivery the transport hands over is settled (acknowledged) exactly when it is safe:

* a message taken in by a flow: after the transaction that records it commits (a redelivered
  copy that arrives meanwhile is settled with it, never before: settling it early could
  leave no durable copy if that transaction then fails);
* a message dropped without being consumed (a duplicate, a late message for an ended
  session): only after a transaction that checked the node's lease has passed after the
  decision, so a process that was replaced without knowing it drops nothing its successor
  needs (:meth:`Deliveries.settle_dropped`).

Dead letters are settled by whoever wrote them (their write is itself a fenced transaction).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from statemachine.ports import InboundMessage


class Deliveries:
    """Deliveries being taken in, and dropped ones waiting for a lease check."""

    def __init__(self, acknowledge: Callable[[InboundMessage], None]) -> None:
        self._acknowledge = acknowledge
        self._taking_in: dict[str, list[InboundMessage]] = {}
        self._dropped: list[InboundMessage] = []
        self._dropped_mark = 0

    def take_in(self, message: InboundMessage) -> None:
        """Hold ``message`` until the transaction that takes it in commits."""
        self._taking_in[message.message_id] = [message]

    def add_copy(self, message: InboundMessage) -> bool:
        """True (and held) if a copy from the same sender is being taken in already."""
        held = self._taking_in.get(message.message_id)
        if held is None or held[0].sender != message.sender:
            return False
        held.append(message)
        return True

    def undo_take_in(self, message: InboundMessage) -> None:
        """``message`` was not taken in after all (taking it in failed)."""
        held = self._taking_in.get(message.message_id)
        if held is not None and held[0] is message:
            del self._taking_in[message.message_id]

    def release(self, message_ids: Sequence[str]) -> list[InboundMessage]:
        """Stop holding these messages as taken in; returns their deliveries (to route again)."""
        released: list[InboundMessage] = []
        for mid in dict.fromkeys(message_ids):
            released.extend(self._taking_in.pop(mid, ()))
        return released

    def settle(self, message_ids: Sequence[str], fenced: bool, transactions: int) -> None:
        """Settle every held delivery of each id.

        ``fenced``: a transaction that checked the lease committed after the decision (the
        executor's commit), so they are acknowledged now; otherwise they are dropped.
        """
        for mid in message_ids:
            for delivery in self._taking_in.pop(mid, ()):
                if fenced:
                    self._acknowledge(delivery)
                else:
                    self.drop(delivery, transactions)

    def drop(self, message: InboundMessage, transactions: int) -> None:
        """Settle ``message`` (not consumed) once a lease check has passed after now.

        ``transactions`` is the count of fenced commits so far: one more by the time the
        drops are settled proves the lease was checked after the decision.
        """
        if not self._dropped:
            self._dropped_mark = transactions
        self._dropped.append(message)

    def settle_dropped(self, transactions: int, check_lease: Callable[[], None]) -> None:
        """Acknowledge what was dropped, checking the lease first unless a commit did."""
        if not self._dropped:
            return
        if transactions == self._dropped_mark:
            check_lease()  # no fenced commit since the decisions: check now
        dropped, self._dropped = self._dropped, []
        for message in dropped:
            self._acknowledge(message)
