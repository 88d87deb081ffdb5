"""The inline outbox relay: a :class:`~messaging.relay.Relay` inside the scheduler's rounds.

It sends each committed row when the scheduler hands it over and deletes the rows taken at
the end of the round (:meth:`OutboxRelay.flush`); a row the transport refused is retried
after a growing number of rounds, capped. The test network steps it, so the crash points
around it stay deterministic; node processes use the threaded
:class:`~messaging.background_relay.BackgroundOutboxRelay`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import attrs

from messaging.authentication import CannotAuthenticateError, MessageAuthenticator
from messaging.relay import AbandonCheck, OutboxStore, log_abandoned
from messaging.service import SESSION_TOPIC, Message, MessagingService, TransportError
from statemachine.ports import OutboxRow

__all__ = ["MAX_BACKOFF_ROUNDS", "OutboxRelay", "OutboxStore"]

log = logging.getLogger("fiberflow.outbox")

MAX_BACKOFF_ROUNDS = 64


@attrs.define
class _Retry:
    row: OutboxRow
    attempts: int
    due_round: int
    off_map: bool = False
    """Its target is not on the network map: no round of a test network can deliver it."""


class OutboxRelay:
    """Moves outbox rows to a transport in the scheduler's rounds; see the module docstring."""

    def __init__(
        self,
        transport: MessagingService,
        store: OutboxStore,
        on_boundary: Callable[[str], None] | None = None,
        authenticator: MessageAuthenticator | None = None,
    ) -> None:
        """``authenticator`` tags each message for its target (None: sent without a tag).

        A target the authenticator has no key for yet is treated like a target the
        transport refuses: the row stays in the outbox and is tried again with the backoff.
        """
        self._transport = transport
        self._authenticator = authenticator
        self._store = store
        self._on_boundary = on_boundary
        self._taken: list[str] = []
        self._retries: list[_Retry] = []
        self._round = 0
        self.handed_off = 0
        """Messages the transport has taken (for statistics and benchmarks)."""
        self.refused = 0
        """Send attempts the transport refused (each one is retried)."""
        self.abandon: AbandonCheck | None = None
        """Asked about a row whose target is off the network map (see the Relay protocol)."""

    def resend_pending(self) -> int:
        """Send every row left in the outbox (node start); returns how many there were."""
        rows = self._store.pending_outbox()
        self.hand_off(rows)
        return len(rows)

    def hand_off(self, rows: Sequence[OutboxRow]) -> None:
        """Try to send each row now; failures are retried by :meth:`retry_due`."""
        for row in rows:
            self._try(row, attempts=0)

    def _try(self, row: OutboxRow, attempts: int) -> bool:
        try:
            message = Message(row.message_id, SESSION_TOPIC, self._transport.my_address, row.data)
            if self._authenticator is not None:
                message = self._authenticator.authenticate(message, row.target)
            self._transport.send(message, row.target)
        except Exception as error:  # a refusal, or a row that cannot be framed or tagged
            if isinstance(error, CannotAuthenticateError) and self.abandon is not None:
                reason = self.abandon(row)
                if reason is not None:
                    self._store.delete_outbox([row.message_id])
                    log_abandoned(row, reason)
                    return False
            if not isinstance(error, TransportError):
                log.error(
                    "message %s for %s cannot be sent (%s); it stays in the outbox",
                    row.message_id,
                    row.target,
                    error,
                )
            backoff = min(2**attempts, MAX_BACKOFF_ROUNDS)
            self.refused += 1
            log.info(
                "transport refused %s (%s); retry in %d rounds", row.message_id, error, backoff
            )
            off_map = isinstance(error, CannotAuthenticateError)
            self._retries.append(_Retry(row, attempts + 1, self._round + backoff, off_map))
            return False
        self.handed_off += 1
        self._taken.append(row.message_id)
        if self._on_boundary is not None:
            self._on_boundary("after_hand_off")
        return True

    def retry_due(self) -> bool:
        """Retry refused rows whose backoff has passed; True if any was tried."""
        self._round += 1
        due = [r for r in self._retries if r.due_round <= self._round]
        if not due:
            return False
        self._retries = [r for r in self._retries if r.due_round > self._round]
        for retry in due:
            self._try(retry.row, retry.attempts)
        return True

    def retry_all_now(self) -> bool:
        """Make every waiting retry due at once (a test network that is otherwise idle).

        True if one of them may get through: a row for a target off the network map waits for
        the map to change, which no round of the network brings about.
        """
        for retry in self._retries:
            retry.due_round = self._round
        return any(not retry.off_map for retry in self._retries)

    def waiting(self) -> int:
        """Rows refused by the transport and waiting for a retry."""
        return len(self._retries)

    def flush(self) -> None:
        """Delete the rows taken since the last flush (one transaction)."""
        if self._taken:
            taken, self._taken = self._taken, []
            self._store.delete_outbox(taken)
            if self._on_boundary is not None:
                self._on_boundary("after_outbox_delete")

    def start(self) -> None:
        """Nothing to start: this relay runs inside the scheduler's rounds."""

    def stop(self) -> None:
        """Nothing to stop (rows not yet deleted are re-sent at the next start)."""

    def idle(self) -> bool:
        """True when no row waits for a retry or for its delete."""
        return not self._retries and not self._taken
