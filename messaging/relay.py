"""The outbox relay's contract, stated once; two relays implement it.

A relay (Corda's "bridge") moves committed outbox rows to the transport, each tagged for its
target by the node's :class:`~messaging.authentication.MessageAuthenticator`, and deletes
each row only once the transport has durably taken it; a row the transport refused, or whose
target the node shares no key with yet, is retried; on start, every row left in the
outbox is sent again. A crash between hand-off and delete therefore re-sends, never loses:
the receiver drops the duplicate by its message id.

* :class:`~messaging.outbox_relay.OutboxRelay` runs inside the scheduler's rounds (the test
  network steps it, so crash points stay deterministic);
* :class:`~messaging.background_relay.BackgroundOutboxRelay` runs on its own thread (node
  processes: the scheduler never waits for the transport).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from statemachine.ports import OutboxRow

__all__ = [
    "AbandonCheck",
    "DeferredDeletes",
    "OutboxStore",
    "Relay",
    "ThreadedRelayBase",
    "log_abandoned",
]

log = logging.getLogger("fiberflow.outbox")

AbandonCheck = Callable[[OutboxRow], "str | None"]
"""Asked by a relay about a row for a target that is not on the network map: the reason to
stop trying it (its flow has ended, an operator dropped it), or None to keep trying.

A relay that gets a reason stops retrying the row and deletes it from the outbox (it may
already be gone). The node gives its relay :meth:`flows.node.node.Node.abandoned_reason`.
"""


def log_abandoned(row: OutboxRow, reason: str) -> None:
    """One WARNING line for a row a relay stopped trying."""
    log.warning("message %s for %s is no longer sent: %s", row.message_id, row.target, reason)


class OutboxStore(Protocol):
    """The outbox table, as a relay needs it."""

    def pending_outbox(self) -> list[OutboxRow]:
        """Every row still in the outbox, oldest first."""

    def delete_outbox(self, message_ids: Sequence[str]) -> None:
        """Delete rows the transport has durably taken."""


class DeferredDeletes(Protocol):
    """Deleting outbox rows with a transaction the node commits anyway.

    The node database's outbox (:class:`persistence.outbox.SqlOutbox`): rows queued by
    :meth:`delete_later` are deleted by the next state machine transaction, before it
    commits; :meth:`delete_waiting` deletes, in a transaction of their own, those no
    transaction has taken (a node with nothing else to commit).
    """

    def delete_later(self, message_ids: Sequence[str]) -> None:
        """Delete these rows (taken by the transport) with the node's next transaction."""

    def delete_waiting(self, older_than: float = 0.0) -> int:
        """Delete the queued rows now if the oldest has waited ``older_than`` s; how many."""


class Relay(Protocol):
    """Moves committed outbox rows to the transport (see the module docstring).

    The scheduler calls :meth:`hand_off` after each commit; the node calls :meth:`retry_due`
    and :meth:`flush` around each round, which a relay on its own thread may ignore.
    """

    handed_off: int
    """Messages the transport has taken (for statistics and benchmarks)."""
    refused: int
    """Send attempts the transport refused (each one is retried)."""
    abandon: AbandonCheck | None
    """Asked before a row for a target off the network map is tried again (None: always)."""

    def start(self) -> None:
        """Begin relaying (a threaded relay starts its thread)."""

    def stop(self) -> None:
        """Stop relaying; rows not yet deleted are sent again at the next start."""

    def hand_off(self, rows: Sequence[OutboxRow]) -> None:
        """Send committed rows (now, or queued for the relay's thread)."""

    def resend_pending(self) -> int:
        """Send every row left in the outbox (node start); returns how many there were."""

    def retry_due(self) -> bool:
        """Retry refused rows whose backoff has passed; True if any was tried."""

    def retry_all_now(self) -> bool:
        """Make every waiting retry due at once; True if there was any (test networks)."""

    def flush(self) -> None:
        """Delete the rows the transport took since the last flush."""

    def waiting(self) -> int:
        """Rows refused by the transport and waiting for a retry."""

    def idle(self) -> bool:
        """True when no row waits for a send, a retry or its delete."""


class ThreadedRelayBase:
    """What a relay running on threads of its own does on the scheduler's side.

    The threaded relays (:class:`~messaging.background_relay.BackgroundOutboxRelay`,
    :class:`~messaging.bridges.BridgeManager`) send, retry and delete on their own threads:
    the scheduler's ``retry_due`` and ``flush`` have nothing to do, and a start re-sends
    what the outbox still holds through ``hand_off``.
    """

    _store: OutboxStore

    def hand_off(self, rows: Sequence[OutboxRow]) -> None:
        """Queue committed rows for the relay's threads (each relay says how)."""
        raise NotImplementedError

    def resend_pending(self) -> int:
        """Queue every row left in the outbox (node start); returns how many there were."""
        rows = self._store.pending_outbox()
        self.hand_off(rows)
        return len(rows)

    def retry_due(self) -> bool:
        """Retries run on the relay's threads; nothing to do on the scheduler's."""
        return False

    def retry_all_now(self) -> bool:
        """Not used by node processes (the test network drives the inline relay)."""
        return False

    def flush(self) -> None:
        """Deletes happen on the relay's threads."""
