"""Send-only connections to a peer's inbound: what a bridge writes through.

In the peer-to-peer topology every node owns its inbound queue (its own RabbitMQ broker or
vhost, or its own SQL queue database) and publishes that queue's address in its node-info,
without credentials. A bridge (:mod:`messaging.bridges`) opens a :class:`PeerSender` to that
address with the credentials this node was given for the peer's transport, and hands it
authenticated messages for the peer; it never consumes there.

* ``amqp://`` / ``amqps://``: a confirm-mode publisher on the peer's broker; the peer's
  account needs write on the ``p2p.inbound`` exchange only. Over ``amqps://`` the broker's
  certificate is verified with the context the ``tls`` factory makes (the network root, and
  this node's certificate as client certificate: :mod:`messaging.tls`);
* ``sqlite:///`` / ``postgresql://``: inserts into the peer's queue table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol
from urllib.parse import quote, urlsplit, urlunsplit

import attrs

from messaging.service import Message, TransportError
from messaging.tls import TlsContextFactory
from messaging.transports import AMQP_SCHEMES, TransportUrlError, transport_scheme

__all__ = [
    "PEER_RECONNECT_SECONDS",
    "Credentials",
    "PeerSender",
    "open_peer_sender",
    "public_address",
    "with_credentials",
]

PEER_RECONNECT_SECONDS = 2.0
"""How long one AMQP send to a peer tries to reconnect before it is refused (the bridge
then backs off and tries again: a peer that is down must not hold its bridge for long)."""


@attrs.frozen
class Credentials:
    """A user and password for a peer's transport (given to this node by that peer)."""

    user: str
    password: str = attrs.field(repr=False)


class PeerSender(Protocol):
    """A send-only connection to one peer's inbound."""

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """Hand every (message, target) over; returns once the peer's transport took all.

        Raises :class:`~messaging.service.TransportError` if it could not (the caller keeps
        the messages and tries again later).
        """

    def close(self) -> None:
        """Close the connection (closing twice is harmless)."""


def public_address(url: str) -> str:
    """``url`` without its user and password: what a node publishes as its inbound."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite" or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def with_credentials(url: str, credentials: Credentials | None) -> str:
    """``url`` (a published, credential-free address) with ``credentials`` put in."""
    if credentials is None or url.startswith("sqlite:"):
        return url
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    user = quote(credentials.user, safe="")
    password = quote(credentials.password, safe="")
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def open_peer_sender(url: str, name: str, tls: TlsContextFactory | None = None) -> PeerSender:
    """A sender to the inbound at ``url`` (credentials included); ``name`` labels it.

    ``tls`` makes the context of an ``amqps://`` connection (None: the system's trust store).
    Raises :class:`~messaging.service.TransportError` if the peer's transport cannot be
    reached now (or TLS refused it), :class:`~messaging.transports.TransportUrlError` if
    ``url`` is unusable.
    """
    scheme = transport_scheme(url)
    if scheme in AMQP_SCHEMES:
        return _AmqpPeerSender(url, name, tls)
    return _SqlPeerSender(url)


class _AmqpPeerSender:
    """Publishes to the peer broker's ``p2p.inbound`` exchange, confirmed."""

    def __init__(self, url: str, name: str, tls: TlsContextFactory | None) -> None:
        try:
            from messaging.amqp.publisher import Publisher
            from messaging.amqp.topology import split_options
        except ImportError as error:
            raise TransportUrlError(
                f"an AMQP peer needs pika (pip install 'fiberflow[amqp]'): {error}"
            ) from error
        plain, _ = split_options(url)
        self._publisher = Publisher(plain, f"fiberflow bridge {name}", PEER_RECONNECT_SECONDS, tls)

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """See :class:`PeerSender`."""
        from messaging.amqp.publisher import Outgoing

        outgoing = [Outgoing.of(message, target) for message, target in items]
        if outgoing:
            self._publisher.publish(outgoing)

    def close(self) -> None:
        """See :class:`PeerSender`."""
        self._publisher.close()


class _SqlPeerSender:
    """Inserts into the peer's SQL queue (its SQLite file or its PostgreSQL database)."""

    def __init__(self, url: str) -> None:
        from sqlalchemy.exc import SQLAlchemyError

        from messaging.sqlqueue import SqlQueueBroker

        try:
            self._broker = SqlQueueBroker(url)
        except SQLAlchemyError as error:
            raise TransportError(f"cannot open the peer's queue database: {error}") from error

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """See :class:`PeerSender`."""
        self._broker.enqueue(items)

    def close(self) -> None:
        """See :class:`PeerSender`."""
        self._broker.close()
