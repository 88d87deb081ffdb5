"""Publishing: a confirm-mode channel on its own connection, shared by every sending thread.

``send`` returns once the broker has confirmed, that is, has written the message to disk; a
pika connection is not thread-safe, so the channel is used under a lock. When the broker goes
away a send reconnects and re-publishes what was not confirmed for up to ``reconnect_timeout``
seconds, then raises :class:`~messaging.service.TransportError`; at once if TLS refused a
certificate (the broker's, or this side's): trying again would not help.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

import attrs
import pika

from messaging.amqp.connection import (
    AMQP_ERRORS,
    REFUSALS,
    Channel,
    Connection,
    backoff_seconds,
    close_quietly,
    open_channel,
    safe_url,
)
from messaging.amqp.topology import declare_queues, publish, queue_name
from messaging.service import TransportError
from messaging.tls import TlsContextFactory, certificate_refusal

log = logging.getLogger("fiberflow.amqp")

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
    """A framed message on its way to ``target``'s inbound queue."""

    target: str
    body: bytes
    message_id: str | None


class Publisher:
    """A confirm-mode channel on its own connection, shared by every sending thread."""

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

    def declare(self, address: str) -> None:
        """Make sure the queues of ``address`` exist."""
        self._run(
            functools.partial(declare_queues, address=address),
            f"while declaring the queues of {address}",
        )

    def publish(self, outgoing: Sequence[Outgoing]) -> None:
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
                except REFUSALS:
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
                self._connection, self._channel = open_channel(self._url, self._name, self._tls)
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

    def _drop(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            close_quietly(connection)
