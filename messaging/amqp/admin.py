"""Tools for administrators and tests: topology set-up, permissions, dead letters, queues.

Each opens a short-lived connection of its own; pika's errors become
:class:`~messaging.service.TransportError`. Those that take ``tls`` use it for the context of
an ``amqps://`` URL (see :func:`~messaging.amqp.connection.connect`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from messaging.amqp.connection import AMQP_ERRORS, Channel, close_quietly, open_channel, safe_url
from messaging.amqp.topology import (
    REASON_HEADER,
    dead_letter_queue_name,
    declare_queues,
    inbound_queue_names,
    node_key,
    publish,
    queue_name,
    split_options,
)
from messaging.service import TransportError
from messaging.tls import TlsContextFactory, certificate_refusal


def setup_topology(admin_url: str, addresses: Sequence[str]) -> None:
    """As an administrator: create the exchanges and each node's queues and bindings."""
    with _tool_channel(admin_url, "setting up the topology") as channel:
        for address in addresses:
            declare_queues(channel, address)


def permission_commands(address: str, user: str, password: str, vhost: str = "/") -> list[str]:
    """The ``rabbitmqctl`` commands giving ``user`` exactly what node ``address`` needs.

    The permissions are on ``vhost`` (the virtual host of the nodes' broker URLs).

    Configure: nothing (the administrator set the topology up). Write: the two exchanges
    (publishing to any node's inbound queue, and to dead-letter queues, goes through them;
    the default exchange, which reaches every queue, is not allowed). Read: the node's own
    queues only, its partitions' inbound queues included (consuming; other nodes' queues are
    refused, and so is binding anything to the exchanges, which needs read on them).
    """
    own = f"^p2p\\.(inbound|deadletter)\\.{node_key(address)}(\\.[0-9]+)?$"
    return [
        f"rabbitmqctl add_user '{user}' '{password}'",
        f"rabbitmqctl set_permissions -p '{vhost}' '{user}' '^$' '^p2p\\.(inbound|deadletter)$' "
        f"'{own}'",
    ]


def peer_account_commands(vhost: str, user: str, password: str) -> list[str]:
    """The ``rabbitmqctl`` commands making ``user`` a peer's account on a node's broker.

    For the peer-to-peer topology, run by the operator of the node that owns ``vhost`` (its
    inbound) for each peer sending to it: the account may publish to the ``p2p.inbound``
    exchange, and so reach the node's inbound queue, and nothing else: it may not configure
    anything, read any queue, or publish to another exchange (the default exchange included).
    """
    return [
        f"rabbitmqctl add_user '{user}' '{password}'",
        f"rabbitmqctl set_permissions -p '{vhost}' '{user}' '^$' '^p2p\\.inbound$' '^$'",
    ]


def url_vhost(url: str) -> str:
    """The virtual host an ``amqp://`` URL names (its path, percent-decoded; ``/`` if none)."""
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def node_url(admin_url: str, user: str, password: str) -> str:
    """A node's transport URL on the broker and vhost of ``admin_url``, as ``user``.

    The vhost is percent-encoded (``/`` is ``%2F``), and ``?declare=false`` says the
    administrator set the topology up.
    """
    parts = urlsplit(admin_url)
    host = parts.netloc.rpartition("@")[2]
    vhost = quote(url_vhost(admin_url), safe="")
    return f"{parts.scheme}://{user}:{password}@{host}/{vhost}?declare=false"


@contextlib.contextmanager
def _tool_channel(url: str, what: str, tls: TlsContextFactory | None = None) -> Iterator[Channel]:
    """A confirm-mode channel on a short-lived connection; pika errors become TransportError."""
    url, _ = split_options(url)
    try:
        connection, channel = open_channel(url, f"fiberflow tool: {what}", tls)
    except AMQP_ERRORS as error:
        problem = certificate_refusal(error) or repr(error)
        raise TransportError(f"cannot reach the broker at {safe_url(url)}: {problem}") from error
    try:
        yield channel
    except AMQP_ERRORS as error:
        raise TransportError(f"{what} failed on {safe_url(url)}: {error!r}") from error
    finally:
        close_quietly(connection)


def read_dead_letters(
    url: str, address: str, tls: TlsContextFactory | None = None
) -> list[tuple[bytes, str]]:
    """(frame, reason) of each dead letter of ``address``, oldest first, leaving them in place.

    Every dead letter is fetched without an ack and then rejected back to the queue (it keeps
    its place), so reading is not destructive and may be repeated.
    """
    found: list[tuple[bytes, str]] = []
    with _tool_channel(url, f"reading the dead letters of {address}", tls) as channel:
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


def inject_raw(url: str, address: str, raw: bytes, tls: TlsContextFactory | None = None) -> None:
    """Publish raw bytes to ``address``'s queue as if a broken sender had sent them (tests)."""
    with _tool_channel(url, f"injecting into {address}", tls) as channel:
        publish(channel, queue_name(address), raw)


def queue_depth(url: str, address: str, tls: TlsContextFactory | None = None) -> int:
    """Messages ready in ``address``'s inbound queues (not those a live consumer holds)."""
    with _tool_channel(url, f"measuring the queues of {address}", tls) as channel:
        return sum(
            int(channel.queue_declare(name, passive=True).method.message_count)
            for name in inbound_queue_names(address)
        )


def delete_queues(url: str, address: str, tls: TlsContextFactory | None = None) -> None:
    """Delete the inbound and dead-letter queues of ``address`` and their messages (tests)."""
    with _tool_channel(url, f"deleting the queues of {address}", tls) as channel:
        for name in [*inbound_queue_names(address), dead_letter_queue_name(address)]:
            channel.queue_delete(name)
