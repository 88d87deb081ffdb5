"""The threaded outbox relay: a :class:`~messaging.relay.Relay` for node processes.

The scheduler never waits on it: it hands committed outbox rows over
(:meth:`BackgroundOutboxRelay.hand_off` only queues them); the relay thread sends them in
batches (``send_batch``), then deletes the rows the transport has durably taken. A batch the
transport refuses is sent row by row, so one unreachable target does not hold the others
back; each refused row is retried after a jittered, exponentially growing delay (50 ms
doubling up to 5 s). A crash at any point leaves the undeleted rows in the outbox: the next
start sends them again and the receiver drops duplicates by id.

Given ``deletes`` (the node database's outbox), the rows taken are not deleted in a
transaction of their own: they ride in the node's next state machine transaction, and the
relay deletes only what no transaction took within :data:`DELETE_WAIT_SECONDS`.
"""

from __future__ import annotations

import heapq
import logging
import queue
import random
import threading
import time
from collections.abc import Sequence

from messaging.authentication import CannotAuthenticateError, MessageAuthenticator
from messaging.relay import (
    AbandonCheck,
    DeferredDeletes,
    OutboxStore,
    ThreadedRelayBase,
    log_abandoned,
)
from messaging.service import SESSION_TOPIC, Message, MessagingService, TransportError
from statemachine.ports import OutboxRow

__all__ = [
    "BATCH_SIZE",
    "DELETE_WAIT_SECONDS",
    "MAX_BACKOFF_SECONDS",
    "MIN_BACKOFF_SECONDS",
    "BackgroundOutboxRelay",
]

log = logging.getLogger("fiberflow.relay")

BATCH_SIZE = 500
MIN_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 5.0
DELETE_WAIT_SECONDS = 0.2
"""How long taken rows wait for a node transaction to delete them before the relay does."""


class BackgroundOutboxRelay(ThreadedRelayBase):
    """Moves outbox rows to the transport on a background thread (see the module docstring)."""

    def __init__(
        self,
        transport: MessagingService,
        store: OutboxStore,
        *,
        seed: int | None = None,
        authenticator: MessageAuthenticator | None = None,
        deletes: DeferredDeletes | None = None,
    ) -> None:
        """A relay from ``store`` to ``transport`` (not started).

        ``seed`` seeds the retry jitter; ``authenticator`` tags each message (None: no tag);
        a target the authenticator has no key for yet is retried like one the transport
        refuses (:class:`~messaging.authentication.CannotAuthenticateError`). ``deletes``
        lets the node's transactions delete the rows taken (see the docstring).
        """
        self._transport = transport
        self._authenticator = authenticator
        self._store = store
        self._deletes = deletes
        self._incoming: queue.SimpleQueue[Sequence[OutboxRow] | None] = queue.SimpleQueue()
        self._retries: list[tuple[float, int, OutboxRow]] = []  # a heap of (due, n, row)
        self._failed_attempts: dict[str, int] = {}
        self._retry_counter = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._outstanding = 0
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.handed_off = 0
        """Messages the transport has taken."""
        self.refused = 0
        """Send attempts the transport refused (each one is retried)."""
        self.abandon: AbandonCheck | None = None
        """Asked about a row whose target is off the network map (see the Relay protocol)."""

    # --- the scheduler's side ---------------------------------------------------------

    def start(self) -> None:
        """Start the relay thread."""
        if self._thread is not None:
            raise RuntimeError("the relay is already running")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="outbox-relay", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread after the batch in hand (rows left behind are sent next start)."""
        self._stopping.set()
        self._incoming.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the outbox relay did not stop within %.0f s", timeout)
            self._thread = None
        if self._deletes is not None:
            try:
                self._deletes.delete_waiting()
            except Exception as error:  # the database may be gone: the rows are resent
                log.warning("outbox delete failed at stop (%s); rows resent next start", error)

    def hand_off(self, rows: Sequence[OutboxRow]) -> None:
        """Queue committed rows for the relay thread (returns at once)."""
        if rows:
            with self._lock:
                self._outstanding += len(rows)
            self._incoming.put(list(rows))

    def waiting(self) -> int:
        """Rows refused by the transport and waiting for a retry."""
        with self._lock:
            return len(self._retries)

    def idle(self) -> bool:
        """True when every row handed over has been taken and deleted."""
        with self._lock:
            return self._outstanding == 0

    # --- the relay thread ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                rows = self._next_batch()
                if rows and not self._stopping.is_set():
                    self._send(rows)
                if self._deletes is not None:
                    self._deletes.delete_waiting(DELETE_WAIT_SECONDS)
            except Exception:  # never let the thread die: rows stay in the outbox regardless
                log.exception("outbox relay error; carrying on (unsent rows are resent at start)")
                time.sleep(MIN_BACKOFF_SECONDS)

    def _next_batch(self) -> list[OutboxRow]:
        with self._lock:
            next_due = self._retries[0][0] if self._retries else None
        timeout = 0.5 if next_due is None else max(0.0, min(0.5, next_due - time.monotonic()))
        rows: list[OutboxRow] = []
        try:
            first = self._incoming.get(timeout=timeout)
            if first is None:
                return []
            rows.extend(first)
            while len(rows) < BATCH_SIZE:
                more = self._incoming.get_nowait()
                if more is None:
                    self._stopping.set()
                    break
                rows.extend(more)
        except queue.Empty:
            pass
        now = time.monotonic()
        with self._lock:
            while self._retries and self._retries[0][0] <= now and len(rows) < BATCH_SIZE:
                rows.append(heapq.heappop(self._retries)[2])
        return rows

    def _send(self, rows: list[OutboxRow]) -> None:
        try:
            self._transport.send_batch([self._prepare(row) for row in rows])
            taken = rows
        except Exception as error:  # a refusal, or a row that cannot be framed or tagged
            log.info("transport refused a batch of %d (%s); sending one by one", len(rows), error)
            taken = []
            for row in rows:
                try:
                    self._transport.send_batch([self._prepare(row)])
                    taken.append(row)
                except Exception as single_error:
                    if self._abandoned(row, single_error):
                        continue
                    if not isinstance(single_error, TransportError):
                        log.error(
                            "message %s for %s cannot be sent (%s); it stays in the outbox",
                            row.message_id,
                            row.target,
                            single_error,
                        )
                    self._schedule_retry(row, single_error)
        if taken:
            self._delete([row.message_id for row in taken])

    def _abandoned(self, row: OutboxRow, error: Exception) -> bool:
        """True if ``row`` (its target off the network map) is no longer to be sent: dropped."""
        if not isinstance(error, CannotAuthenticateError) or self.abandon is None:
            return False
        reason = self.abandon(row)
        if reason is None:
            return False
        self._store.delete_outbox([row.message_id])
        log_abandoned(row, reason)
        self._failed_attempts.pop(row.message_id, None)
        with self._lock:
            self._outstanding -= 1
        return True

    def _prepare(self, row: OutboxRow) -> tuple[Message, str]:
        message = self._message(row)
        if self._authenticator is not None:
            message = self._authenticator.authenticate(message, row.target)
        return message, row.target

    def _message(self, row: OutboxRow) -> Message:
        return Message(row.message_id, SESSION_TOPIC, self._transport.my_address, row.data)

    def _schedule_retry(self, row: OutboxRow, error: Exception) -> None:
        attempts = self._failed_attempts.get(row.message_id, 0) + 1
        self._failed_attempts[row.message_id] = attempts
        backoff = min(MIN_BACKOFF_SECONDS * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS)
        delay = backoff * (0.5 + self._random.random() / 2)  # jitter: 50-100 % of the backoff
        self.refused += 1
        if attempts in (1, 5) or attempts % 20 == 0:
            log.warning(
                "transport refused %s for %s (attempt %d: %s); retry in %.2f s",
                row.message_id,
                row.target,
                attempts,
                error,
                delay,
            )
        with self._lock:
            self._retry_counter += 1
            heapq.heappush(self._retries, (time.monotonic() + delay, self._retry_counter, row))

    def _delete(self, message_ids: list[str]) -> None:
        if self._deletes is not None:
            self._deletes.delete_later(message_ids)  # with the node's next transaction
        else:
            self._delete_now(message_ids)
        for message_id in message_ids:
            self._failed_attempts.pop(message_id, None)
        with self._lock:
            self.handed_off += len(message_ids)
            self._outstanding -= len(message_ids)

    def _delete_now(self, message_ids: list[str]) -> None:
        delay = MIN_BACKOFF_SECONDS
        while True:
            try:
                self._store.delete_outbox(message_ids)
                break
            except Exception as error:  # the database may be busy or gone for a moment
                if self._stopping.is_set():
                    log.warning("outbox delete failed at stop (%s); rows resent next start", error)
                    break
                log.warning("outbox delete failed (%s); retry in %.2f s", error, delay)
                time.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
