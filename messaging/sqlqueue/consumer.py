"""The SQL queue's consumer: one node's ``MessagingService`` on a queue database.

:class:`SqlQueueMessaging` sends through the :class:`~messaging.sqlqueue.broker.SqlQueueBroker`
and consumes its node's queue on a thread of its own, claiming under a lease named by its
consumer id (a node passes its worker id).

Back-pressure: a consumer holds at most ``window`` deliveries (2,000 by default, like the AMQP
prefetch) and ``window_bytes`` of frames (64 MiB, plus at most one frame) handed to the node and
not yet acknowledged; it claims nothing more until acknowledgements make room.

Waking: on PostgreSQL the consumer ``LISTEN``s for the sends' ``NOTIFY`` (with a slow poll
as a safety net); on SQLite a send from another process wakes it by a datagram
(:mod:`messaging.sqlqueue.wakeups`) and one from the same process by an event, and it polls
every 50 ms as a safety net; where it cannot listen for datagrams it polls adaptively, from
1 ms after a message to 50 ms when idle.

Acknowledgements are buffered and deleted in batches by the consumer thread, in the
transaction of its next claim (one commit for both): an acknowledgement lost in a crash only
means a redelivery, which the node drops by its id.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
from sqlalchemy.exc import SQLAlchemyError

from foundation.engine import application_name
from messaging.frame import MAX_FRAME_BYTES, MalformedFrameError, decode_frame
from messaging.service import Message, MessageHandler
from messaging.sqlqueue.broker import CLAIM_BATCH, CLAIM_BYTES, SqlQueueBroker, local_wakeup
from messaging.sqlqueue.wakeups import WakeListener
from statemachine.partitions import partition_of_message

log = logging.getLogger("fiberflow.sqlqueue")

DEFAULT_WINDOW = 2000
"""Deliveries a consumer holds unacknowledged before it stops claiming (as the AMQP prefetch)."""
DEFAULT_WINDOW_BYTES = 64 * 1024 * 1024
"""Frame bytes a consumer holds unacknowledged before it stops claiming (it may go over by one
claim's first frame, so at most this plus one frame)."""
MIN_POLL_SECONDS = 0.001
MAX_POLL_SECONDS = 0.05
"""Adaptive polling bounds on SQLite (PostgreSQL waits for NOTIFY, polling at most each 1 s)."""
LISTEN_POLL_SECONDS = 1.0
DEFAULT_LEASE_SECONDS = 60.0
"""How long a claimed, unacknowledged message stays invisible to a live consumer."""


class SqlQueueMessaging:
    """A node's ``MessagingService`` on the SQL queue at ``url`` (see the module docstring).

    ``window`` and ``window_bytes`` bound what the node holds delivered and unacknowledged (in
    messages, and in frame bytes plus at most one frame); ``max_frame_bytes`` is the largest
    frame it takes (larger ones are dead-lettered).
    """

    def __init__(
        self,
        url: str,
        address: str,
        *,
        synchronous: str = "FULL",
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        consumer_id: str | None = None,
        window: int = DEFAULT_WINDOW,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if window < 1 or window_bytes < 1 or max_frame_bytes < 1:
            raise ValueError("window, window_bytes and max_frame_bytes must be positive")
        self._address = address
        self._lease_seconds = lease_seconds
        self._window = window
        self._window_bytes = window_bytes
        self._max_frame_bytes = max_frame_bytes
        self.broker = SqlQueueBroker(
            url,
            synchronous=synchronous,
            application_name=None if consumer_id is None else application_name(consumer_id),
        )
        self._handlers: dict[str, MessageHandler] = {}
        self._partitions: frozenset[int] | None = None
        """The partitions whose messages this consumer takes (None: every message)."""
        self._owner = consumer_id or uuid.uuid4().hex
        self._pending_acks: list[int] = []  # row ids of settled deliveries
        self._acks_in_flight: list[int] = []  # taken up by a flush, rows not deleted yet
        self._in_handler: int | None = None  # the row id a handler is being given now
        self._outstanding: dict[int, int] = {}  # row id -> frame size, delivered, not settled
        self._outstanding_bytes = 0
        self._acks_lock = threading.Lock()
        """Guards the pending acks and the outstanding deliveries."""
        self._wakeup = local_wakeup(self.broker.url, address)
        self._wake_listener = WakeListener(self.broker.url, address, self._wakeup)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.window_full = threading.Event()
        """Set while the consumer waits, its window full, for acknowledgements (tests)."""
        self.delivered = 0
        """Messages handed to handlers (redeliveries included)."""
        self.dead_lettered = 0
        """Frames this consumer moved to the dead letters."""
        self.rerouted = 0
        """Deliveries of partitions this consumer does not take, given back to theirs."""
        self.broker.create_queue(address)

    @property
    def my_address(self) -> str:
        """The queue name of this node."""
        return self._address

    @property
    def consumer_id(self) -> str:
        """The id this consumer leases messages under (a node passes its worker id)."""
        return self._owner

    def release_deliveries_of(self, consumer_ids: Sequence[str]) -> None:
        """Deliver again now what consumers known to be dead had leased.

        (Without this their leases would have to expire first.)
        """
        released = self.broker.release_leases(self._address, list(consumer_ids))
        if released:
            log.info(
                "%s: %d messages leased by a dead consumer will be delivered again",
                self._address,
                released,
            )

    def consume_partitions(self, partitions: frozenset[int] | None) -> None:
        """Take only messages of ``partitions`` from now on (None: every message).

        A worker of a node run by several workers calls this whenever its partitions change.
        A delivery of another partition (claimed before the change, or a row an older sender
        wrote without a partition) is not handed to a handler: it is given back, routed to
        its partition. The consumer of partition 0 also takes those unrouted rows.
        """
        self._partitions = None if partitions is None else frozenset(partitions)
        self._wakeup.set()

    def release(self, delivered: Message) -> None:
        """Give a delivery back unsettled: it is delivered again.

        To whoever takes its partition then: a worker handing a partition over gives back
        what it still holds of it.
        """
        if not isinstance(delivered.receipt, int):
            raise ValueError(f"{delivered.message_id} was not delivered by this queue")
        with self._acks_lock:
            self._outstanding_bytes -= self._outstanding.pop(delivered.receipt, 0)
        self.broker.give_back(self._address, delivered.receipt, self._owner)
        self._wakeup.set()

    def add_handler(self, topic: str, callback: MessageHandler) -> None:
        """Deliver ``topic`` messages to ``callback`` (on the consumer thread)."""
        if topic in self._handlers:
            raise ValueError(f"a handler for topic {topic!r} is already registered")
        self._handlers[topic] = callback

    def start(self) -> None:
        """Start consuming.

        Messages another consumer leased come once their leases expire, or at once after
        :meth:`release_deliveries_of`.
        """
        if self._thread is not None:
            raise RuntimeError(f"the consumer of {self._address} is already running")
        self._forget_outstanding()
        self._stopping.clear()
        self._wake_listener.start()
        self._thread = threading.Thread(
            target=self._consume, name=f"sqlqueue-consumer-{self._address}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop consuming, write buffered acknowledgements, close connections.

        What was delivered but not acknowledged is given back (the next consumer gets it at
        once).
        """
        self._halt()
        try:
            self._flush_acks()
            with contextlib.suppress(SQLAlchemyError):  # else the leases simply expire
                self.broker.release_leases(self._address, [self._owner])
        finally:
            self._forget_outstanding()
            self.broker.close()

    def abandon(self) -> None:
        """Stop as a crashed process would: buffered acknowledgements are lost (tests)."""
        self._halt()
        with self._acks_lock:
            self._pending_acks = []
        self._forget_outstanding()
        self.broker.close()

    def _forget_outstanding(self) -> None:
        with self._acks_lock:
            self._outstanding = {}
            self._outstanding_bytes = 0

    def _halt(self) -> None:
        self._stopping.set()
        self._wakeup.set()
        self._wake_listener.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                log.error("%s: the consumer thread did not stop within 30 s", self._address)
            self._thread = None

    def send(self, message: Message, target: str) -> None:
        """Commit ``message`` to ``target``'s queue."""
        self.broker.enqueue([(message, target)])

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """Commit every pair in one transaction."""
        self.broker.enqueue(items)

    def acknowledge(self, delivered: Message) -> None:
        """Mark this delivery done; its row is deleted by the consumer thread shortly."""
        if not isinstance(delivered.receipt, int):
            raise ValueError(f"{delivered.message_id} was not delivered by this queue")
        with self._acks_lock:
            self._pending_acks.append(delivered.receipt)
            self._outstanding_bytes -= self._outstanding.pop(delivered.receipt, 0)
        self._wakeup.set()

    @property
    def outstanding(self) -> tuple[int, int]:
        """(deliveries, frame bytes) handed to the handlers and not yet acknowledged."""
        with self._acks_lock:
            return len(self._outstanding), self._outstanding_bytes

    @property
    def pending_acknowledgements(self) -> int:
        """Acknowledgements given whose rows are not deleted yet.

        A crash now would deliver those messages again (tests wait for 0 before crashing).
        """
        with self._acks_lock:
            return len(self._pending_acks) + len(self._acks_in_flight)

    def drained(self) -> bool:
        """Whether this consumer's handlers were given every message its queue holds now.

        True when every row of the queue is under this consumer's live lease and a handler
        has had it (and returned): nothing stored is still to come to this consumer, so a
        negative observation made after it (that message never came) means something. For
        tests and operators: it reads the queue's row ids and leases, not its frames.
        """
        rows = self.broker.leases(self._address)
        with self._acks_lock:
            handed = self._outstanding.keys() | set(self._pending_acks) | set(self._acks_in_flight)
            if self._in_handler is not None:  # (its handler has not returned yet)
                handed.discard(self._in_handler)
        return all(owner == self._owner and row_id in handed for row_id, owner in rows)

    def _flush_acks(self) -> None:
        with self._acknowledging() as acks:
            if acks:
                self.broker.acknowledge(self._address, acks)

    @contextlib.contextmanager
    def _acknowledging(self) -> Iterator[list[int]]:
        """The pending acknowledgements, in flight while the block deletes their rows.

        If the block fails they are pending again.
        """
        with self._acks_lock:
            acks, self._pending_acks = self._pending_acks, []
            self._acks_in_flight = acks
        try:
            yield acks
        except SQLAlchemyError:
            with self._acks_lock:
                self._pending_acks[:0] = acks
            raise
        finally:
            with self._acks_lock:
                self._acks_in_flight = []

    def _room(self) -> tuple[int, int]:
        """How many more deliveries, and frame bytes, the window allows now."""
        count, size = self.outstanding
        return self._window - count, self._window_bytes - size

    def _consume(self) -> None:
        listener = None
        interval = MIN_POLL_SECONDS
        failures = 0
        while not self._stopping.is_set():
            try:
                if listener is None and self.broker.dialect == "postgresql":
                    listener = self.broker.listen_connection(self._address)
                room, room_bytes = self._room()
                if room <= 0 or room_bytes <= 0:
                    self._flush_acks()
                    self._wait_for_room(listener)
                    continue
                self.window_full.clear()
                partitions = self._partitions
                with self._acknowledging() as acks:  # deleted in the claim's transaction
                    claim = self.broker.claim(
                        self._address,
                        self._owner,
                        min(CLAIM_BATCH, room),
                        self._lease_seconds,
                        max_bytes=min(CLAIM_BYTES, room_bytes),
                        max_frame_bytes=self._max_frame_bytes,
                        acknowledged=acks,
                        partitions=partitions,
                        take_unrouted=partitions is None or 0 in partitions,
                    )
                failures = 0
            except Exception as error:  # database unavailable: back off and try again
                failures += 1
                delay = min(0.05 * 2**failures, 5.0)
                log.warning(
                    "%s: queue database error (%s); retry in %.2f s", self._address, error, delay
                )
                if listener is not None:
                    listener.close()
                    listener = None
                self._stopping.wait(delay)
                continue
            self.dead_lettered += claim.dead_lettered
            for row_id, raw in claim.rows:
                if self._stopping.is_set():
                    break  # leased but not delivered: the next consumer takes them over
                self._deliver(row_id, raw)
            if claim.rows or claim.dead_lettered:
                interval = MIN_POLL_SECONDS
                continue
            if self._wake_listener.listening:
                interval = MAX_POLL_SECONDS  # sends wake it: the poll is a safety net
            self._wait(listener, interval)
            interval = min(interval * 2, MAX_POLL_SECONDS)
        self.window_full.clear()
        if listener is not None:
            listener.close()

    def _wait_for_room(self, listener: Any) -> None:
        """The window is full: wait for an acknowledgement (or a stop), claiming nothing."""
        self.window_full.set()
        self._wakeup.wait(MAX_POLL_SECONDS)
        self._wakeup.clear()
        if listener is not None:  # drop the notifications meanwhile: they must not pile up
            for _ in listener.notifies(timeout=0):
                pass

    def _wait(self, listener: Any, interval: float) -> None:
        if listener is None:
            self._wakeup.wait(interval)
            self._wakeup.clear()
            return
        if self._wakeup.is_set():
            self._wakeup.clear()
            return
        # PostgreSQL: sleep until NOTIFY (or the safety-net poll), checking local wakeups often.
        deadline = time.monotonic() + LISTEN_POLL_SECONDS
        while not self._stopping.is_set() and time.monotonic() < deadline:
            if any(True for _ in listener.notifies(timeout=0.02, stop_after=1)):
                return
            if self._wakeup.is_set():
                self._wakeup.clear()
                return

    def _deliver(self, row_id: int, raw: bytes) -> None:
        try:
            message = attrs.evolve(decode_frame(raw, self._max_frame_bytes), receipt=row_id)
        except MalformedFrameError as error:
            self._dead_letter(row_id, raw, str(error), None)
            return
        partitions = self._partitions
        if partitions is not None:
            partition = partition_of_message(message.message_id, message.sender)
            if partition not in partitions:  # not ours (any more): to its partition's consumer
                self.broker.give_back(self._address, row_id, self._owner, partition)
                self.rerouted += 1
                return
        handler = self._handlers.get(message.topic)
        if handler is None:
            reason = f"no handler for topic {message.topic!r} at {self._address}"
            self._dead_letter(row_id, raw, reason, message.message_id)
            return
        with self._acks_lock:
            if row_id not in self._outstanding:  # (a redelivery after its lease expired)
                self._outstanding[row_id] = len(raw)
                self._outstanding_bytes += len(raw)
            self._in_handler = row_id
        self.delivered += 1
        try:
            handler(message)
        except Exception:  # a handler bug must not kill the consumer; the lease will expire
            log.exception("%s: handler failed on %s", self._address, message.message_id)
        finally:
            with self._acks_lock:
                self._in_handler = None

    def _dead_letter(self, row_id: int, raw: bytes, reason: str, message_id: str | None) -> None:
        log.warning("%s: dead-lettering stored message %d: %s", self._address, row_id, reason)
        self.broker.dead_letter(self._address, row_id, raw, reason, message_id)
        self.dead_lettered += 1
