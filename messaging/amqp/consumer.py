"""Consuming: one node's ``MessagingService`` on a RabbitMQ broker.

The consumer runs on a thread with its own connection (``basic_qos(prefetch)``, manual acks).
``acknowledge`` may be called from any thread: it queues the delivery's tag (its ``receipt``:
connection generation and delivery tag) and asks the consumer thread, through
``add_callback_threadsafe``, to ack it: one ack with ``multiple=True`` for the run of settled
deliveries from the oldest (:class:`SettledTags`), single acks above a delivery still held.
Delivery tags belong to one connection: an acknowledgement of a delivery made on a
connection that has since died is dropped, because the broker delivers that message again
(and the node drops the duplicate by its id).

The prefetch window (2,000 by default) bounds what the node holds unacknowledged. A node
holds a delivery until the transaction that takes it in commits (milliseconds), plus: messages
for sessions not open yet (at most ``statemachine.manager.MAX_PARKED``, 1,000), messages for
flows an operator paused (held until resumed), and messages for flows whose checkpoint failed
its integrity check (held until retried or killed). Pausing very many busy flows for a long
time can fill the window and stop deliveries to the whole node: resume or kill them.

When the broker goes away (a restart, a network failure), the consumer reconnects with capped
exponential backoff and the broker redelivers whatever was not acknowledged. Sending goes
through the node's :class:`~messaging.amqp.publisher.Publisher`, on a connection of its own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import attrs

from foundation.bounded import bounded_reason
from messaging.amqp.admin import read_dead_letters
from messaging.amqp.connection import (
    AMQP_ERRORS,
    DEFAULT_RECONNECT_SECONDS,
    MAX_BACKOFF_SECONDS,
    Channel,
    Connection,
    backoff_seconds,
    close_quietly,
    open_channel,
    safe_url,
)
from messaging.amqp.publisher import Outgoing, Publisher, property_message_id
from messaging.amqp.topology import (
    DEAD_LETTER_EXCHANGE,
    REASON_HEADER,
    dead_letter_queue_name,
    declare_queues,
    inbound_queue_names,
    partition_queue_name,
    publish,
    split_options,
)
from messaging.frame import (
    MAX_FRAME_BYTES,
    MalformedFrameError,
    decode_frame,
    oversized_problem,
)
from messaging.service import Message, MessageHandler, TransportAuthenticationError
from messaging.tls import TlsContextFactory
from statemachine.limits import DEAD_LETTER_PREFIX_BYTES
from statemachine.partitions import partition_of_message

log = logging.getLogger("fiberflow.amqp")

DEFAULT_PREFETCH = 2000
"""Deliveries a consumer may hold unacknowledged.

Generous on purpose: a node holds messages unacknowledged until the transaction that
consumes them commits, and parks messages that arrive before their session is open; a window
smaller than what a busy node holds would stall delivery.
"""
POLL_SECONDS = 0.1
"""How long the consumer waits for broker events before it checks whether to stop."""


class SettledTags:
    """Which delivery tags of one channel are settled, to acknowledge them with few frames.

    The broker numbers a channel's deliveries 1, 2, 3, ...; an ack with ``multiple=True``
    settles every outstanding delivery up to its tag, which must itself be outstanding.
    :meth:`acks_for` turns tags to acknowledge into one such ack for the run of settled tags
    from the lowest unsettled one (nothing the node still holds is in it), and single acks
    for those above a delivery still held. Tags acked alone (those, and dead letters) are
    remembered: the ``multiple`` ack that later covers their run names the highest tag of the
    run that was not acked alone.
    """

    def __init__(self) -> None:
        self.floor = 0
        """Every tag up to this one is settled."""
        self._above: set[int] = set()
        self._alone: set[int] = set()

    def acked_alone(self, tag: int) -> None:
        """``tag`` was acknowledged on its own (a dead letter)."""
        self._alone.add(tag)
        self._above.add(tag)
        self._advance()

    def acks_for(self, tags: list[int]) -> list[tuple[int, bool]]:
        """The (delivery tag, multiple) acks that settle ``tags`` (each once)."""
        self._above.update(tags)
        run = self._advance()
        acks: list[tuple[int, bool]] = []
        covering = [tag for tag in run if tag not in self._alone]
        if covering:
            acks.append((max(covering), True))
        self._alone.difference_update(run)
        for tag in sorted(tags):
            if tag > self.floor:
                acks.append((tag, False))
                self._alone.add(tag)
        return acks

    def _advance(self) -> list[int]:
        """Raise the floor over the settled tags just above it; returns those tags."""
        run = []
        while self.floor + 1 in self._above:
            self.floor += 1
            self._above.discard(self.floor)
            run.append(self.floor)
        return run


class _ConsumerCancelled(Exception):
    """The broker cancelled the consumer (its queue was deleted): reconnect and redeclare."""


class AmqpMessaging:
    """A node's ``MessagingService`` on the RabbitMQ broker at ``url`` (see :mod:`messaging.amqp`).

    Building one declares the node's queues (raising TransportError if the broker cannot be
    reached within ``reconnect_timeout`` seconds), unless the URL says ``?declare=false``
    (see :func:`split_options`). ``prefetch`` bounds the deliveries the node
    holds unacknowledged (0: no bound); once it holds that many, the broker sends no more until
    some are acknowledged. ``max_frame_bytes`` is the largest body the node takes (larger ones
    are dead-lettered). ``tls`` makes the context of an ``amqps://`` URL's connections (None:
    the system's trust store; see :mod:`messaging.tls`). ``heartbeat`` (seconds) is the
    consumer connection's: a node process frozen (or cut off) that long loses its
    connection, and the broker gives what it held unacknowledged to the queue's next
    consumer (a worker that took its partitions over); None leaves the broker's default.
    """

    def __init__(
        self,
        url: str,
        address: str,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        reconnect_timeout: float = DEFAULT_RECONNECT_SECONDS,
        consumer_id: str | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        tls: TlsContextFactory | None = None,
        heartbeat: int | None = None,
    ) -> None:
        url, self._declare = split_options(url)
        self._heartbeat = heartbeat
        self._tls = tls
        self._consumer_id = consumer_id or uuid.uuid4().hex
        self._max_frame_bytes = max_frame_bytes
        self._url = url
        self._address = address
        self._prefetch = prefetch
        self._handlers: dict[str, MessageHandler] = {}
        self._lock = threading.Lock()
        """Guards the delivery tags, the pending acks and the consumer connection."""
        self._pending_acks: list[tuple[int, int]] = []
        self._pending_releases: list[tuple[int, int]] = []
        """Deliveries to give back unsettled (``basic.nack`` with requeue), as acks are."""
        self._partitions: frozenset[int] | None = None
        """The partitions whose queues this consumer takes (None: every one)."""
        self._subscribed: dict[str, str] = {}
        """Queue name -> consumer tag, on the current channel (the consumer thread's)."""
        self.forwarded = 0
        """Deliveries of partitions this consumer does not take, forwarded to their queue."""
        self._settled = SettledTags()
        """The current connection's settled delivery tags (the consumer thread's)."""
        self._discard_acks = False
        self._generation = 0
        self._consumer_connection: Connection | None = None
        self._consumer_channel: Channel | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0
        """Messages handed to handlers (redeliveries included)."""
        self.dead_lettered = 0
        """Frames this consumer moved to the dead-letter queue."""
        self.reconnects = 0
        """Consumer connections opened after one was lost."""
        self._fatal_error: TransportAuthenticationError | None = None
        self._publisher = Publisher(url, f"fiberflow publisher {address}", reconnect_timeout, tls)
        if self._declare:
            self._publisher.declare(address)

    @property
    def my_address(self) -> str:
        """The address of this node (its queue is :func:`queue_name` of it)."""
        return self._address

    def add_handler(self, topic: str, callback: MessageHandler) -> None:
        """Deliver ``topic`` messages to ``callback`` (on the consumer thread)."""
        if topic in self._handlers:
            raise ValueError(f"a handler for topic {topic!r} is already registered")
        self._handlers[topic] = callback

    @property
    def consumer_id(self) -> str:
        """A random id of this consumer (the broker tracks deliveries per connection)."""
        return self._consumer_id

    def consume_partitions(self, partitions: frozenset[int] | None) -> None:
        """From now on consume only the queues of ``partitions`` (None: every queue).

        The queue from before partitions is consumed along with partition 0. A delivery of a
        partition this consumer does not take (from that queue, from a sender that routed it
        elsewhere, or claimed just before a change) is forwarded to its partition's queue.
        """
        with self._lock:
            self._partitions = None if partitions is None else frozenset(partitions)
            connection = self._consumer_connection
        if connection is not None:
            with contextlib.suppress(*AMQP_ERRORS):  # closed: the next channel subscribes
                connection.add_callback_threadsafe(self._resubscribe)

    def release(self, delivered: Message) -> None:
        """Give a delivery back unsettled (``basic.nack``, requeued), on the consumer thread.

        A delivery of a connection that has since closed is back in its queue already.
        """
        self._settle_later(delivered, release=True)

    def release_deliveries_of(self, consumer_ids: Sequence[str]) -> None:
        """Do nothing: the broker requeues a dead consumer's deliveries itself.

        (It does so when that consumer's connection closes.)
        """

    def start(self) -> None:
        """Start the consumer thread (it connects, and reconnects, in the background)."""
        if self._thread is not None:
            raise RuntimeError(f"the consumer of {self._address} is already running")
        with self._lock:
            self._discard_acks = False
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._consume, name=f"amqp-consumer-{self._address}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop consuming and close both connections; stopping twice is harmless.

        Acknowledged deliveries are acked first; the others go back to the queue.
        """
        self._halt()
        self._publisher.close()

    def abandon(self) -> None:
        """Stop as a killed process would: acknowledgements not yet sent are lost (tests)."""
        with self._lock:
            self._discard_acks = True
            self._pending_acks = []
        self._halt()
        self._publisher.close()

    def send(self, message: Message, target: str) -> None:
        """Publish ``message`` to ``target``'s queue; returns once the broker confirmed it."""
        self.send_batch([(message, target)])

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """Publish every pair in order; returns once the broker confirmed them all."""
        outgoing = [Outgoing.of(m, target) for m, target in items]
        if outgoing:
            try:
                self._publisher.publish(outgoing)
            except TransportAuthenticationError as error:
                self._refused(error)
                raise

    @property
    def fatal_error(self) -> TransportAuthenticationError | None:
        """Why this transport can no longer work (the broker refused the login), or None.

        Set when a connection (the consumer's reconnection, or the publisher's) is refused:
        the consumer stops trying, and a node process stops (:mod:`flows.process.process`).
        """
        return self._fatal_error

    def _refused(self, error: TransportAuthenticationError) -> None:
        if self._fatal_error is None:
            self._fatal_error = error
            log.error("%s: %s; not retrying", self._address, error)

    def acknowledge(self, delivered: Message) -> None:
        """Ack this delivery, and no other copy (on the consumer thread, shortly).

        A delivery from a connection that has since closed needs no ack: the broker put it
        back in the queue when the connection closed.
        """
        self._settle_later(delivered, release=False)

    def _settle_later(self, delivered: Message, *, release: bool) -> None:
        """Queue the delivery's ack (or with ``release`` its nack) for the consumer thread.

        The thread is woken to send it. A receipt of an earlier connection is dropped (the
        broker gave that delivery back when the connection closed).
        """
        receipt = delivered.receipt
        if not isinstance(receipt, tuple):
            raise ValueError(f"{delivered.message_id} was not delivered by this consumer")
        with self._lock:
            if receipt[0] != self._generation:
                return
            # (chosen under the lock: the consumer thread swaps the lists when it flushes)
            (self._pending_releases if release else self._pending_acks).append(receipt)
            connection = self._consumer_connection
        self._wake(connection)

    @property
    def pending_acknowledgements(self) -> int:
        """Acknowledgements given that the consumer thread has not taken up yet.

        What it took up it sends before its connection closes, even when abandoned, and the
        broker applies acks before it closes the connection: once this is 0, a crash loses
        none of them (tests wait for 0 before crashing).
        """
        with self._lock:
            return len(self._pending_acks)

    def _wake(self, connection: Connection | None) -> None:
        """Have the consumer thread send the pending acks now (it also does every poll)."""
        if connection is not None:
            with contextlib.suppress(*AMQP_ERRORS):  # closed: the tags died with it
                connection.add_callback_threadsafe(self._flush_acks)

    def _halt(self) -> None:
        self._stopping.set()
        with self._lock:
            connection = self._consumer_connection
        self._wake(connection)
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                log.error("%s: the consumer thread did not stop within 30 s", self._address)
            self._thread = None

    def _consume(self) -> None:
        failures = 0  # reset once a connection has stayed up for a while
        lost = False
        while not self._stopping.is_set():
            if failures:
                self._stopping.wait(backoff_seconds(failures))
                if self._stopping.is_set():
                    break
            try:
                connection, channel = self._open_consumer()
            except TransportAuthenticationError as error:  # final: retrying cannot help
                self._refused(error)
                break
            except AMQP_ERRORS as error:
                failures += 1
                log.warning(
                    "%s: cannot consume from %s (%r); attempt %d, retry in %.2f s",
                    self._address,
                    safe_url(self._url),
                    error,
                    failures,
                    backoff_seconds(failures),
                )
                continue
            if lost:
                self.reconnects += 1
                log.info("%s: consuming again after a lost connection", self._address)
            opened = time.monotonic()
            try:
                self._serve(connection, channel)
                lost = False
            except (*AMQP_ERRORS, _ConsumerCancelled) as error:
                lost = True
                healthy = time.monotonic() - opened > MAX_BACKOFF_SECONDS
                failures = 0 if healthy else failures + 1
                log.warning(
                    "%s: lost the consumer connection (%r); reconnecting", self._address, error
                )
            finally:
                self._retire(connection)

    def _open_consumer(self) -> tuple[Connection, Channel]:
        connection, channel = open_channel(
            self._url, f"fiberflow consumer {self._address}", self._tls, heartbeat=self._heartbeat
        )
        try:
            if self._declare:
                declare_queues(channel, self._address)
            # One window for the channel's consumers together (one per queue it takes).
            channel.basic_qos(prefetch_count=self._prefetch, global_qos=True)
            self._subscribed = {}
            self._subscribe(channel)
        except BaseException:
            close_quietly(connection)
            raise
        with self._lock:
            self._generation += 1
            self._consumer_connection = connection
            self._consumer_channel = channel
            self._settled = SettledTags()  # delivery tags start again at 1
        return connection, channel

    def _wanted_queues(self) -> list[str]:
        """The inbound queues to consume, given the partitions taken."""
        with self._lock:
            partitions = self._partitions
        names = inbound_queue_names(self._address)
        if partitions is None:
            return names
        legacy = [names[0]] if 0 in partitions else []
        return legacy + [partition_queue_name(self._address, p) for p in sorted(partitions)]

    def _subscribe(self, channel: Channel) -> None:
        """Consume the wanted queues and cancel the others (on the consumer thread)."""
        wanted = self._wanted_queues()
        for name in [name for name in self._subscribed if name not in wanted]:
            channel.basic_cancel(self._subscribed.pop(name))
        for name in wanted:
            if name not in self._subscribed:
                self._subscribed[name] = channel.basic_consume(
                    name, self._on_delivery, auto_ack=False
                )

    def _resubscribe(self) -> None:
        channel = self._consumer_channel
        if channel is not None and channel.is_open:
            self._subscribe(channel)

    def _serve(self, connection: Connection, channel: Channel) -> None:
        while not self._stopping.is_set():
            connection.process_data_events(time_limit=POLL_SECONDS)
            if len(channel.consumer_tags) < len(self._subscribed):  # a queue was deleted
                raise _ConsumerCancelled(f"the broker cancelled a consumer of {self._address}")
            self._flush_acks()
        self._flush_acks()

    def _retire(self, connection: Connection) -> None:
        """Forget the connection's delivery tags (they mean nothing on the next) and close it."""
        with self._lock:
            self._consumer_connection = None
            self._pending_acks = []
        close_quietly(connection)

    def _flush_acks(self) -> None:
        """Ack the pending delivery tags of the current connection (on the consumer thread)."""
        with self._lock:
            if self._discard_acks:
                return
            acks, self._pending_acks = self._pending_acks, []
            releases, self._pending_releases = self._pending_releases, []
            generation = self._generation
            channel = self._consumer_channel
        if channel is None:
            return
        for release_generation, tag in releases:
            if release_generation == generation:
                channel.basic_nack(delivery_tag=tag, requeue=True)
                self._settled.acked_alone(tag)
        tags = [tag for ack_generation, tag in acks if ack_generation == generation]
        for tag, multiple in self._settled.acks_for(tags):
            channel.basic_ack(delivery_tag=tag, multiple=multiple)

    def _on_delivery(self, channel: Channel, method: Any, properties: Any, body: bytes) -> None:
        if self._stopping.is_set():
            return  # not acknowledged: back to the queue when the channel closes
        tag = method.delivery_tag
        if len(body) > self._max_frame_bytes:  # refused on its length, before decoding
            kept = body[:DEAD_LETTER_PREFIX_BYTES]
            reason = oversized_problem(len(body), self._max_frame_bytes)
            reason = f"{reason}; only its first {len(kept)} bytes are kept"
            self._dead_letter(channel, tag, kept, reason)
            return
        try:
            message = decode_frame(body, self._max_frame_bytes)
        except MalformedFrameError as error:
            self._dead_letter(channel, tag, body, str(error))
            return
        with self._lock:
            partitions = self._partitions
        if partitions is not None:
            partition = partition_of_message(message.message_id, message.sender)
            if partition not in partitions:  # not ours (any more): to its partition's queue
                self._forward(channel, tag, body, partition, message.message_id)
                return
        handler = self._handlers.get(message.topic)
        if handler is None:
            reason = f"no handler for topic {message.topic!r} at {self._address}"
            self._dead_letter(channel, tag, body, reason)
            return
        with self._lock:
            message = attrs.evolve(message, receipt=(self._generation, tag))
        self.delivered += 1
        try:
            handler(message)
        except Exception:  # a handler bug must not kill the consumer; redelivered on reconnect
            log.exception("%s: handler failed on %s", self._address, message.message_id)

    def _forward(
        self, channel: Channel, tag: int, raw: bytes, partition: int, message_id: str
    ) -> None:
        """Move a delivery to its partition's queue (confirmed), then ack it."""
        publish(
            channel,
            partition_queue_name(self._address, partition),
            raw,
            message_id=property_message_id(message_id),
        )
        channel.basic_ack(delivery_tag=tag)
        self._settled.acked_alone(tag)
        self.forwarded += 1

    def _dead_letter(self, channel: Channel, tag: int, raw: bytes, reason: str) -> None:
        """Move a delivery to the dead-letter queue (confirmed), then ack it.

        The reason header is a bounded copy (it must fit in an AMQP frame, whatever the
        message held).
        """
        reason = bounded_reason(reason)
        log.warning("%s: dead-lettering delivery %d: %s", self._address, tag, reason)
        publish(
            channel,
            dead_letter_queue_name(self._address),
            raw,
            headers={REASON_HEADER: reason},
            exchange=DEAD_LETTER_EXCHANGE,
        )
        channel.basic_ack(delivery_tag=tag)
        self._settled.acked_alone(tag)
        self.dead_lettered += 1

    def dead_letters(self) -> list[tuple[bytes, str]]:
        """(frame, reason) of each of this node's dead letters: see :func:`read_dead_letters`."""
        return read_dead_letters(self._url, self._address, self._tls)
