"""The AMQP transport: node queues on a RabbitMQ broker.

Queues (durable, ``x-queue-type: classic``), named after the node key (:func:`node_key`):

* ``p2p.inbound.<node key>``: the node's inbound messages, as frames (:mod:`messaging.frame`),
  each a persistent message whose ``message_id`` property is the message id. A node declares
  its queues when its :class:`AmqpMessaging` is built, so a send to a node that has never
  started is unroutable and raises :class:`~messaging.service.TransportError`.
* ``p2p.deadletter.<node key>``: frames the node could not take (undecodable, over the frame
  limit, or of a topic it has no handler for), each with the reason in its
  ``x-fiberflow-reason`` header (cut to ``limits.DEAD_LETTER_REASON_CHARS``, so that the
  header always fits). A body over the frame limit is refused on its length, before it is
  decoded, and only its first ``limits.DEAD_LETTER_PREFIX_BYTES`` are kept.

Both are bound to a durable direct exchange, ``p2p.inbound`` and ``p2p.deadletter``, with the
queue name as routing key. Sending publishes to ``p2p.inbound`` (routing key: the target's
queue), ``mandatory``, on
a channel in publisher-confirm mode: ``send`` returns once the broker has confirmed, that is, has
written the message to disk. Publishing has its own connection, used under a lock (a pika
connection is not thread-safe).

Consuming runs on a thread with its own connection (``basic_qos(prefetch)``, manual acks).
``acknowledge`` may be called from any thread: it queues the delivery's tag (its ``receipt``:
connection generation and delivery tag) and asks the consumer thread, through
``add_callback_threadsafe``, to ack it. Delivery tags belong to one connection: an
acknowledgement of a delivery made on a connection that has since died is dropped, because
the broker delivers that message again (and the node drops the duplicate by its id).

The prefetch window (2,000 by default) bounds what the node holds unacknowledged. A node
holds a delivery until the transaction that takes it in commits (milliseconds), plus: messages
for sessions not open yet (at most ``statemachine.manager.MAX_PARKED``, 1,000), messages for
flows an operator paused (held until resumed), and messages for flows whose checkpoint failed
its integrity check (held until retried or killed). Pausing very many busy flows for a long
time can fill the window and stop deliveries to the whole node: resume or kill them.

When the broker goes away (a restart, a network failure), the consumer reconnects with capped
exponential backoff and the broker redelivers whatever was not acknowledged; a send reconnects
and re-publishes what was not confirmed for up to ``reconnect_timeout`` seconds, then raises
:class:`~messaging.service.TransportError`.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import attrs
import pika

from messaging.frame import (
    MAX_FRAME_BYTES,
    MalformedFrameError,
    decode_frame,
    encode_frame,
    oversized_problem,
)
from messaging.service import Message, MessageHandler, TransportError
from persistence.bounded import bounded_reason
from statemachine.limits import DEAD_LETTER_PREFIX_BYTES

log = logging.getLogger("fiberflow.amqp")

Connection: TypeAlias = Any
"""A ``pika.BlockingConnection`` (pika ships no type information)."""
Channel: TypeAlias = Any
"""A ``pika.adapters.blocking_connection.BlockingChannel``."""

INBOUND_EXCHANGE = "p2p.inbound"
"""The direct exchange every node's inbound queue is bound to (routing key: the queue name)."""
DEAD_LETTER_EXCHANGE = "p2p.deadletter"
"""The direct exchange of the dead-letter queues."""
INBOUND_PREFIX = "p2p.inbound."
"""Prefix of a node's inbound queue name."""
DEAD_LETTER_PREFIX = "p2p.deadletter."
"""Prefix of a node's dead-letter queue name."""
REASON_HEADER = "x-fiberflow-reason"
"""The header of a dead letter that says why its frame was refused."""
QUEUE_ARGUMENTS = {"x-queue-type": "classic"}
"""Arguments every queue is declared with (a redeclaration must use the same ones)."""

DEFAULT_PREFETCH = 2000
"""Deliveries a consumer may hold unacknowledged.

Generous on purpose: a node holds messages unacknowledged until the transaction that
consumes them commits, and parks messages that arrive before their session is open; a window
smaller than what a busy node holds would stall delivery.
"""
DEFAULT_RECONNECT_SECONDS = 30.0
"""How long a send keeps reconnecting before it raises TransportError."""
MIN_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 5.0
"""Bounds of the wait between reconnection attempts (doubling from the minimum)."""
POLL_SECONDS = 0.1
"""How long the consumer waits for broker events before it checks whether to stop."""
BLOCKED_CONNECTION_SECONDS = 10.0
"""A connection the broker blocks (resource alarm) longer than this is dropped (and retried)."""


class _ConsumerCancelled(Exception):
    """The broker cancelled the consumer (its queue was deleted): reconnect and redeclare."""


_AMQP_ERRORS = (pika.exceptions.AMQPError, OSError)
_REFUSALS = (pika.exceptions.UnroutableError, pika.exceptions.NackError)


def node_key(address: str) -> str:
    """The key naming the queues of the node at ``address`` (32 hex digits)."""
    return hashlib.sha256(address.encode()).hexdigest()[:32]


def queue_name(address: str) -> str:
    """The inbound queue of the node at ``address``: ``p2p.inbound.<node key>``.

    The node key is the start of the SHA-256 of the address for now; it will become the hash
    of the node's public key once nodes have keys.
    """
    return INBOUND_PREFIX + node_key(address)


def dead_letter_queue_name(address: str) -> str:
    """The dead-letter queue of the node at ``address``: ``p2p.deadletter.<node key>``."""
    return DEAD_LETTER_PREFIX + node_key(address)


def safe_url(url: str) -> str:
    """``url`` with its password hidden (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def backoff_seconds(attempt: int) -> float:
    """The wait before reconnection attempt ``attempt`` (1, 2, ...): 0.1 s doubling up to 5 s."""
    return min(MIN_BACKOFF_SECONDS * 2.0 ** min(max(attempt - 1, 0), 16), MAX_BACKOFF_SECONDS)


def connect(url: str, name: str) -> Connection:
    """One attempt to connect to the broker at ``url``; ``name`` shows in its connection list."""
    parameters = pika.URLParameters(url)
    if parameters.blocked_connection_timeout is None:
        parameters.blocked_connection_timeout = BLOCKED_CONNECTION_SECONDS
    parameters.client_properties = {
        "connection_name": name,
        **(parameters.client_properties or {}),
    }
    return pika.BlockingConnection(parameters)


def open_channel(url: str, name: str) -> tuple[Connection, Channel]:
    """A new connection to ``url`` and a channel on it in publisher-confirm mode."""
    connection = connect(url, name)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
    except BaseException:
        close_quietly(connection)
        raise
    return connection, channel


def close_quietly(connection: Connection) -> None:
    """Close ``connection`` if it is open, ignoring a broker that is already gone."""
    if connection.is_open:
        with contextlib.suppress(*_AMQP_ERRORS):
            connection.close()


def declare_queues(channel: Channel, address: str) -> None:
    """Make sure the exchanges, the two queues of ``address`` and their bindings exist."""
    for exchange in (INBOUND_EXCHANGE, DEAD_LETTER_EXCHANGE):
        channel.exchange_declare(exchange, exchange_type="direct", durable=True)
    for exchange, name in (
        (INBOUND_EXCHANGE, queue_name(address)),
        (DEAD_LETTER_EXCHANGE, dead_letter_queue_name(address)),
    ):
        channel.queue_declare(name, durable=True, arguments=QUEUE_ARGUMENTS)
        channel.queue_bind(name, exchange, routing_key=name)


def publish(
    channel: Channel,
    queue: str,
    body: bytes,
    *,
    message_id: str | None = None,
    headers: dict[str, str] | None = None,
    exchange: str = INBOUND_EXCHANGE,
) -> None:
    """Publish ``body`` persistently to ``queue`` through ``exchange``; returns once confirmed.

    Raises ``pika.exceptions.UnroutableError`` if ``queue`` is not bound to the exchange
    (``channel`` must be in publisher-confirm mode).
    """
    properties = pika.BasicProperties(
        delivery_mode=pika.DeliveryMode.Persistent, message_id=message_id, headers=headers
    )
    channel.basic_publish(
        exchange=exchange, routing_key=queue, body=body, properties=properties, mandatory=True
    )


def split_options(url: str) -> tuple[str, bool]:
    """``url`` without fiberflow's own query option, and whether the node declares its queues.

    ``?declare=false`` says the queues, exchanges and bindings were set up by an administrator
    (:func:`setup_topology`): a node whose broker user may not configure anything needs it.
    """
    parts = urlsplit(url)
    kept, declare = [], True
    for item in filter(None, parts.query.split("&")):
        key, _, value = item.partition("=")
        if key == "declare":
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"declare must be true or false, not {value!r}")
            declare = value.lower() in ("true", "1")
        else:
            kept.append(item)
    return urlunsplit(parts._replace(query="&".join(kept))), declare


def setup_topology(admin_url: str, addresses: Sequence[str]) -> None:
    """As an administrator: create the exchanges and each node's queues and bindings."""
    with _tool_channel(admin_url, "setting up the topology") as channel:
        for address in addresses:
            declare_queues(channel, address)


def permission_commands(address: str, user: str, password: str) -> list[str]:
    """The ``rabbitmqctl`` commands giving ``user`` exactly what node ``address`` needs.

    Configure: nothing (the administrator set the topology up). Write: the two exchanges
    (publishing to any node's inbound queue, and to dead-letter queues, goes through them;
    the default exchange, which reaches every queue, is not allowed). Read: the node's own
    two queues only (consuming; other nodes' queues are refused, and so is binding anything
    to the exchanges, which needs read on them).
    """
    own = f"^p2p\\.(inbound|deadletter)\\.{node_key(address)}$"
    return [
        f"rabbitmqctl add_user '{user}' '{password}'",
        f"rabbitmqctl set_permissions -p / '{user}' '^$' '^p2p\\.(inbound|deadletter)$' '{own}'",
    ]


AMQP_SHORT_STRING_BYTES = 255
"""The longest AMQP short string (the ``message_id`` property is one), in UTF-8 bytes."""


def property_message_id(message_id: str) -> str | None:
    """The ``message_id`` property for a message: its id, or None if too long for it.

    An AMQP short string holds 255 bytes; a longer id (possible within the 200-character limit
    in multi-byte characters) would make the publish fail. The frame carries the id anyway:
    the property is only for operators.
    """
    if len(message_id.encode("utf-8", "surrogatepass")) > AMQP_SHORT_STRING_BYTES:
        return None
    return message_id


@attrs.frozen
class _Outgoing:
    target: str
    body: bytes
    message_id: str | None


class _Publisher:
    """A confirm-mode channel on its own connection, shared by every sending thread."""

    def __init__(self, url: str, name: str, reconnect_timeout: float) -> None:
        self._url = url
        self._name = name
        self._reconnect_timeout = reconnect_timeout
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        self._channel: Channel | None = None

    def declare(self, address: str) -> None:
        """Make sure the queues of ``address`` exist."""
        self._run(
            functools.partial(declare_queues, address=address),
            f"while declaring the queues of {address}",
        )

    def publish(self, outgoing: Sequence[_Outgoing]) -> None:
        """Publish every message, in order; returns once the broker confirmed the last."""
        pending = collections.deque(outgoing)

        def publish_pending(channel: Channel) -> None:
            while pending:
                item = pending[0]
                publish(channel, queue_name(item.target), item.body, message_id=item.message_id)
                pending.popleft()

        try:
            self._run(publish_pending, "while publishing")
        except pika.exceptions.UnroutableError:
            raise TransportError(
                f"no queue for {pending[0].target} on {safe_url(self._url)} "
                "(that node has never started on this broker)"
            ) from None
        except pika.exceptions.NackError as error:
            raise TransportError(
                f"the broker refused message {pending[0].message_id} to {pending[0].target}"
            ) from error

    def close(self) -> None:
        """Close the connection (the next publish opens a new one)."""
        with self._lock:
            self._drop()

    def _run(self, operation: Callable[[Channel], None], what: str) -> None:
        """Run ``operation``, reconnecting and running it again while the timeout allows.

        Unroutable and nacked publishes raise pika's errors, for the caller to name the target.
        """
        deadline = time.monotonic() + self._reconnect_timeout
        with self._lock:
            while True:
                channel = self._open(deadline, what)
                try:
                    operation(channel)
                    return
                except _REFUSALS:
                    raise
                except pika.exceptions.AMQPChannelError as error:
                    self._drop()
                    raise TransportError(
                        f"the broker closed the channel {what}: {error!r}"
                    ) from error
                except _AMQP_ERRORS as error:
                    self._drop()
                    if time.monotonic() >= deadline:
                        raise TransportError(
                            f"lost the broker at {safe_url(self._url)} {what}: {error!r}"
                        ) from error
                    log.warning(
                        "%s: connection lost %s (%r); reconnecting", self._name, what, error
                    )

    def _open(self, deadline: float, what: str) -> Channel:
        if self._channel is not None and self._channel.is_open:
            return self._channel
        self._drop()
        attempt = 0
        while True:
            attempt += 1
            try:
                self._connection, self._channel = open_channel(self._url, self._name)
                return self._channel
            except _AMQP_ERRORS as error:
                delay = backoff_seconds(attempt)
                if time.monotonic() + delay > deadline:
                    raise TransportError(
                        f"cannot reach the broker at {safe_url(self._url)} {what}: {error!r}"
                    ) from error
                log.warning(
                    "%s: cannot reach the broker at %s (%r); attempt %d, retry in %.2f s",
                    self._name,
                    safe_url(self._url),
                    error,
                    attempt,
                    delay,
                )
                time.sleep(delay)

    def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            close_quietly(connection)


class AmqpMessaging:
    """A node's ``MessagingService`` on the RabbitMQ broker at ``url`` (see the module docstring).

    Building one declares the node's queues (raising TransportError if the broker cannot be
    reached within ``reconnect_timeout`` seconds), unless the URL says ``?declare=false``
    (see :func:`split_options`). ``prefetch`` bounds the deliveries the node
    holds unacknowledged (0: no bound); once it holds that many, the broker sends no more until
    some are acknowledged. ``max_frame_bytes`` is the largest body the node takes (larger ones
    are dead-lettered).
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
    ) -> None:
        url, self._declare = split_options(url)
        self._consumer_id = consumer_id or uuid.uuid4().hex
        self._max_frame_bytes = max_frame_bytes
        self._url = url
        self._address = address
        self._prefetch = prefetch
        self._handlers: dict[str, MessageHandler] = {}
        self._lock = threading.Lock()
        """Guards the delivery tags, the pending acks and the consumer connection."""
        self._pending_acks: list[tuple[int, int]] = []
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
        self._publisher = _Publisher(url, f"fiberflow publisher {address}", reconnect_timeout)
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
        outgoing = [
            _Outgoing(target, encode_frame(m), property_message_id(m.message_id))
            for m, target in items
        ]
        if outgoing:
            self._publisher.publish(outgoing)

    def acknowledge(self, delivered: Message) -> None:
        """Ack this delivery, and no other copy (on the consumer thread, shortly).

        A delivery from a connection that has since closed needs no ack: the broker put it
        back in the queue when the connection closed.
        """
        receipt = delivered.receipt
        if not isinstance(receipt, tuple):
            raise ValueError(f"{delivered.message_id} was not delivered by this consumer")
        with self._lock:
            if receipt[0] != self._generation:
                return
            self._pending_acks.append(receipt)
            connection = self._consumer_connection
        self._wake(connection)

    def _wake(self, connection: Connection | None) -> None:
        """Have the consumer thread send the pending acks now (it also does every poll)."""
        if connection is not None:
            with contextlib.suppress(*_AMQP_ERRORS):  # closed: the tags died with it
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
            except _AMQP_ERRORS as error:
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
            except (*_AMQP_ERRORS, _ConsumerCancelled) as error:
                lost = True
                healthy = time.monotonic() - opened > MAX_BACKOFF_SECONDS
                failures = 0 if healthy else failures + 1
                log.warning(
                    "%s: lost the consumer connection (%r); reconnecting", self._address, error
                )
            finally:
                self._retire(connection)

    def _open_consumer(self) -> tuple[Connection, Channel]:
        connection, channel = open_channel(self._url, f"fiberflow consumer {self._address}")
        try:
            if self._declare:
                declare_queues(channel, self._address)
            channel.basic_qos(prefetch_count=self._prefetch)
            channel.basic_consume(queue_name(self._address), self._on_delivery, auto_ack=False)
        except BaseException:
            close_quietly(connection)
            raise
        with self._lock:
            self._generation += 1
            self._consumer_connection = connection
            self._consumer_channel = channel
        return connection, channel

    def _serve(self, connection: Connection, channel: Channel) -> None:
        while not self._stopping.is_set():
            connection.process_data_events(time_limit=POLL_SECONDS)
            if not channel.consumer_tags:  # the broker cancelled it (the queue was deleted)
                raise _ConsumerCancelled(f"the broker cancelled the consumer of {self._address}")
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
            generation = self._generation
            channel = self._consumer_channel
        if channel is None:
            return
        for ack_generation, tag in acks:
            if ack_generation == generation:
                channel.basic_ack(delivery_tag=tag)

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
        self.dead_lettered += 1

    def dead_letters(self) -> list[tuple[bytes, str]]:
        """(frame, reason) of each of this node's dead letters: see :func:`read_dead_letters`."""
        return read_dead_letters(self._url, self._address)


@contextlib.contextmanager
def _tool_channel(url: str, what: str) -> Iterator[Channel]:
    """A confirm-mode channel on a short-lived connection; pika errors become TransportError."""
    url, _ = split_options(url)
    try:
        connection, channel = open_channel(url, f"fiberflow tool: {what}")
    except _AMQP_ERRORS as error:
        raise TransportError(f"cannot reach the broker at {safe_url(url)}: {error!r}") from error
    try:
        yield channel
    except _AMQP_ERRORS as error:
        raise TransportError(f"{what} failed on {safe_url(url)}: {error!r}") from error
    finally:
        close_quietly(connection)


def read_dead_letters(url: str, address: str) -> list[tuple[bytes, str]]:
    """(frame, reason) of each dead letter of ``address``, oldest first, leaving them in place.

    Every dead letter is fetched without an ack and then rejected back to the queue (it keeps
    its place), so reading is not destructive and may be repeated.
    """
    found: list[tuple[bytes, str]] = []
    with _tool_channel(url, f"reading the dead letters of {address}") as channel:
        last_tag = None
        while True:
            method, properties, body = channel.basic_get(dead_letter_queue_name(address))
            if method is None:
                break
            last_tag = method.delivery_tag
            found.append((bytes(body), _reason(properties)))
        if last_tag is not None:
            channel.basic_nack(delivery_tag=last_tag, multiple=True, requeue=True)
    return found


def _reason(properties: Any) -> str:
    reason = (properties.headers or {}).get(REASON_HEADER, "")
    return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)


def inject_raw(url: str, address: str, raw: bytes) -> None:
    """Publish raw bytes to ``address``'s queue as if a broken sender had sent them (tests)."""
    with _tool_channel(url, f"injecting into {address}") as channel:
        publish(channel, queue_name(address), raw)


def queue_depth(url: str, address: str) -> int:
    """Messages ready in ``address``'s queue (deliveries a live consumer holds not counted)."""
    with _tool_channel(url, f"measuring the queue of {address}") as channel:
        declared = channel.queue_declare(queue_name(address), passive=True)
        return int(declared.method.message_count)


def delete_queues(url: str, address: str) -> None:
    """Delete the inbound and dead-letter queues of ``address`` and their messages (tests)."""
    with _tool_channel(url, f"deleting the queues of {address}") as channel:
        for name in (queue_name(address), dead_letter_queue_name(address)):
            channel.queue_delete(name)
