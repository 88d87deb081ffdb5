"""Publishing: a transactional channel on its own connection, shared by every sending thread.

``publish`` sends a batch in AMQP transactions of at most :data:`TX_BATCH` messages: every
``basic.publish`` of a transaction is written without waiting, then one ``tx.commit``. The
broker answers ``tx.commit-ok`` only once it has taken every message of the transaction the
way a publisher confirm says it has (a persistent message in a durable queue: written to
disk), and refuses the commit (closing the channel, ``PRECONDITION_FAILED``) if it had to
refuse one of them (what a ``basic.nack`` says in confirm mode). So a batch costs one round
trip per transaction, not one per message (a confirm per publish did that), and the
guarantee is the same: ``publish`` returns once the broker has durably taken the whole batch.

Messages are ``mandatory``: one that no queue takes (its target never started on this
broker) comes back as ``basic.return`` before the ``tx.commit-ok``; ``publish`` then raises
:class:`~messaging.service.TransportError` naming the target. A refused commit raises it too,
naming the targets of the transaction. After either, the caller must assume none of the batch
was taken (the others were; sending them again is safe: receivers drop duplicates by id).

A pika connection is not thread-safe, so the channel is used under a lock. When the broker
goes away a send reconnects and publishes again the transactions not yet committed, for up to
``reconnect_timeout`` seconds, then raises :class:`~messaging.service.TransportError`; at
once if TLS refused a certificate (the broker's, or this side's): trying again would not help.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pika
from pika.spec import PRECONDITION_FAILED

from messaging.amqp.connection import (
    AMQP_ERRORS,
    Channel,
    Connection,
    backoff_seconds,
    close_quietly,
    open_channel,
    safe_url,
)
from messaging.amqp.topology import declare_queues, message_queue_name, publish
from messaging.frame import encode_frame
from messaging.service import Message, TransportError
from messaging.tls import TlsContextFactory, certificate_refusal

log = logging.getLogger("fiberflow.amqp")

TX_BATCH = 256
"""Most messages per AMQP transaction (a batch is sent in transactions of at most this many)."""
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
class Outgoing:
    """A framed message on its way to ``queue``, an inbound queue of ``target``."""

    target: str
    body: bytes
    message_id: str | None
    queue: str

    @classmethod
    def of(cls, message: Message, target: str) -> Outgoing:
        """``message`` framed, for the queue of its partition of ``target``'s flows."""
        return cls(
            target,
            encode_frame(message),
            property_message_id(message.message_id),
            message_queue_name(target, message.message_id, message.sender),
        )


class _Unroutable(Exception):
    """The broker returned a message: no queue of the target's takes it."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


class Publisher:
    """A transactional channel on its own connection, shared by every sending thread."""

    def __init__(
        self,
        url: str,
        name: str,
        reconnect_timeout: float,
        tls: TlsContextFactory | None = None,
    ) -> None:
        """A publisher to ``url`` (``tls``: the context of ``amqps://`` connections)."""
        self._url = url
        self._tls = tls
        self._name = name
        self._reconnect_timeout = reconnect_timeout
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        self._channel: Channel | None = None
        self._returned: list[str] = []
        """Targets of the messages the broker returned in the transaction in hand."""
        self._targets: dict[str, str] = {}
        """Queue name -> target, of the transaction in hand."""

    def declare(self, address: str) -> None:
        """Make sure the queues of ``address`` exist."""
        self._run(
            functools.partial(declare_queues, address=address),
            f"while declaring the queues of {address}",
        )

    def publish(self, outgoing: Sequence[Outgoing]) -> None:
        """Publish every message, in order; returns once the broker has taken them all.

        One ``tx.commit`` per :data:`TX_BATCH` messages (see the module docstring).
        """
        pending = collections.deque(outgoing)

        def publish_pending(channel: Channel) -> None:
            while pending:
                chunk = [pending[i] for i in range(min(TX_BATCH, len(pending)))]
                self._returned.clear()
                self._targets = {item.queue: item.target for item in chunk}
                for item in chunk:
                    publish(channel, item.queue, item.body, message_id=item.message_id)
                try:
                    channel.tx_commit()
                except pika.exceptions.ChannelClosedByBroker as error:
                    if error.reply_code != PRECONDITION_FAILED:
                        raise
                    targets = ", ".join(sorted({item.target for item in chunk}))
                    raise TransportError(
                        f"the broker refused a message of a batch to {targets} ({error.reply_text})"
                    ) from error
                channel.connection.process_data_events(time_limit=0)  # dispatch any returns
                if self._returned:
                    raise _Unroutable(self._returned[0])
                for _ in chunk:
                    pending.popleft()

        try:
            self._run(publish_pending, "while publishing")
        except _Unroutable as unroutable:
            raise TransportError(
                f"no queue for {unroutable.target} on {safe_url(self._url)} "
                "(that node has never started on this broker)"
            ) from None

    def close(self) -> None:
        """Close the connection (the next publish opens a new one)."""
        with self._lock:
            self._drop()

    def _run(self, operation: Callable[[Channel], None], what: str) -> None:
        """Run ``operation``, reconnecting and running it again while the timeout allows.

        A refused message raises :class:`_Unroutable` or TransportError (``operation`` says).
        """
        deadline = time.monotonic() + self._reconnect_timeout
        with self._lock:
            while True:
                channel = self._open(deadline, what)
                try:
                    operation(channel)
                    return
                except (_Unroutable, TransportError):
                    self._drop()  # the channel may hold an unfinished transaction
                    raise
                except pika.exceptions.AMQPChannelError as error:
                    self._drop()
                    raise TransportError(
                        f"the broker closed the channel {what}: {error!r}"
                    ) from error
                except AMQP_ERRORS as error:
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
                self._connection, self._channel = open_channel(
                    self._url, self._name, self._tls, transactional=True
                )
                self._channel.add_on_return_callback(self._on_return)
                return self._channel
            except AMQP_ERRORS as error:
                refused = certificate_refusal(error)
                if refused is not None:
                    raise TransportError(
                        f"cannot reach the broker at {safe_url(self._url)} {what}: {refused}"
                    ) from error
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

    def _on_return(self, _channel: Channel, method: Any, _properties: Any, _body: bytes) -> None:
        """The broker returned a message (mandatory, no queue took it): note its target."""
        self._returned.append(self._targets.get(method.routing_key, method.routing_key))

    def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            close_quietly(connection)
