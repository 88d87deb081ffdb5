"""Connecting to RabbitMQ: one attempt, a confirm-mode channel, closing, backoff, safe URLs.

Everything that talks to the broker (:mod:`messaging.amqp.publisher`,
:mod:`messaging.amqp.consumer`, :mod:`messaging.amqp.admin`) opens its connections here.
An ``amqps://`` URL connects with TLS: with the context a :data:`~messaging.tls.TlsContextFactory`
makes (the node's trust and client certificate), else with the system's trust store; the
host name of the URL is verified either way.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import pika

from messaging.service import TransportAuthenticationError
from messaging.tls import TlsContextFactory, TlsSetupError

Connection: TypeAlias = Any
"""A ``pika.BlockingConnection`` (pika ships no type information)."""
Channel: TypeAlias = Any
"""A ``pika.adapters.blocking_connection.BlockingChannel``."""

DEFAULT_RECONNECT_SECONDS = 30.0
"""How long a send keeps reconnecting before it raises TransportError."""
MIN_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 5.0
"""Bounds of the wait between reconnection attempts (doubling from the minimum)."""
BLOCKED_CONNECTION_SECONDS = 10.0
"""A connection the broker blocks (resource alarm) longer than this is dropped (and retried)."""

AMQP_ERRORS = (pika.exceptions.AMQPError, OSError)
"""What pika raises when the broker or the network fails (worth a reconnection)."""


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


AUTHENTICATION_ERRORS = (
    pika.exceptions.ProbableAuthenticationError,
    pika.exceptions.AuthenticationError,
    pika.exceptions.ProbableAccessDeniedError,
)
"""What pika raises when the broker refuses the user, its password or its vhost access."""
ACCESS_REFUSED = 403
"""The AMQP reply code of a refused login (``ACCESS_REFUSED``)."""


def authentication_refusal(error: BaseException) -> str | None:
    """What the broker said when it refused the login, or None for another failure.

    A refused login (a wrong user or password, a vhost the user may not use) is final:
    reconnecting would be refused again for ever.
    """
    if isinstance(error, AUTHENTICATION_ERRORS):
        return _reply_text(error)
    if (
        isinstance(error, pika.exceptions.ConnectionClosedByBroker)
        and error.reply_code == ACCESS_REFUSED
    ):
        return str(error.reply_text)
    return None


def _reply_text(error: BaseException) -> str:
    """The broker's words inside pika's wrapping (``ACCESS_REFUSED - Login was refused ...``)."""
    text = str(error)
    start = text.find("ACCESS_REFUSED")
    if start >= 0:
        return text[start:].split("'", 1)[0].split('"', 1)[0].rstrip(" .") or text
    return text or type(error).__name__


def connect(
    url: str, name: str, tls: TlsContextFactory | None = None, heartbeat: int | None = None
) -> Connection:
    """One attempt to connect to the broker at ``url``; ``name`` shows in its connection list.

    A refused login raises :class:`~messaging.service.TransportAuthenticationError` (final;
    no caller retries it); other failures raise pika's errors (:data:`AMQP_ERRORS`).

    An ``amqps://`` URL uses ``tls`` for its context (None: the system's trust store); the
    broker's certificate must be valid for the URL's host. ``tls`` is ignored for ``amqp://``.
    ``heartbeat`` (seconds) asks for that heartbeat unless the URL names one: the broker
    closes a connection whose peer stays silent about that long, giving back its deliveries.
    """
    parameters = pika.URLParameters(url)
    if heartbeat is not None and "heartbeat=" not in url:
        parameters.heartbeat = heartbeat
    if parameters.ssl_options is not None:
        try:
            context = tls() if tls is not None else ssl.create_default_context()
        except TlsSetupError as error:  # a file gone since start: a failed connection
            raise pika.exceptions.AMQPConnectionError(str(error)) from error
        parameters.ssl_options = pika.SSLOptions(context, parameters.host)
    if parameters.blocked_connection_timeout is None:
        parameters.blocked_connection_timeout = BLOCKED_CONNECTION_SECONDS
    parameters.client_properties = {
        "connection_name": name,
        **(parameters.client_properties or {}),
    }
    try:
        return pika.BlockingConnection(parameters)
    except pika.exceptions.AMQPError as error:
        refusal = authentication_refusal(error)
        if refusal is None:
            raise
        user = parameters.credentials.username
        raise TransportAuthenticationError(
            f"the broker at {safe_url(url)} refused the login of user {user!r}: "
            f"{refusal} (check the user and password in the URL, and the user's permissions on "
            f"the vhost {parameters.virtual_host!r})"
        ) from error


def open_channel(
    url: str,
    name: str,
    tls: TlsContextFactory | None = None,
    *,
    transactional: bool = False,
    heartbeat: int | None = None,
) -> tuple[Connection, Channel]:
    """A new connection to ``url`` (see :func:`connect`) and a channel on it.

    The channel is in publisher-confirm mode (each publish waits for its confirm), or with
    ``transactional``, in transaction mode (``tx.select``: publishes are written without a
    wait and ``tx_commit`` returns once the broker has taken every one of them; see
    :mod:`messaging.amqp.publisher`).
    """
    connection = connect(url, name, tls, heartbeat)
    try:
        channel = connection.channel()
        if transactional:
            channel.tx_select()
        else:
            channel.confirm_delivery()
    except BaseException:
        close_quietly(connection)
        raise
    return connection, channel


def close_quietly(connection: Connection) -> None:
    """Close ``connection`` if it is open, ignoring a broker that is already gone."""
    if connection.is_open:
        with contextlib.suppress(*AMQP_ERRORS):
            connection.close()
