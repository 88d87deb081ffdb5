"""Open a transport from its URL (what a node's ``transport_url`` names).

* ``sqlite:///path/queue.db``: the SQL queue in a SQLite file shared by the nodes of a host
  (the embedded default);
* ``postgresql://user@host/db``: the SQL queue on PostgreSQL, for nodes on many hosts;
* ``amqp://user:password@host:5672/vhost``: RabbitMQ (needs the ``amqp`` extra);
  ``amqps://...:5671/vhost`` for RabbitMQ over TLS.
"""

from __future__ import annotations

from collections.abc import Sequence

from messaging.service import MessagingService
from messaging.tls import TlsContextFactory

SQL_QUEUE_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg")
AMQP_SCHEMES = ("amqp", "amqps")


class TransportUrlError(ValueError):
    """A transport URL this fiberflow cannot open; the message names what is wrong."""


def transport_scheme(url: str) -> str:
    """The scheme of a transport URL, checked against the supported ones."""
    if "://" not in url:
        raise TransportUrlError(
            f"{url!r} is not a URL (try sqlite:///queue.db, postgresql://host/db or "
            "amqp://guest:guest@127.0.0.1:5672/%2F)"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SQL_QUEUE_SCHEMES + AMQP_SCHEMES:
        raise TransportUrlError(
            f"unsupported transport scheme {scheme!r} in {url!r}: use sqlite, postgresql or amqp"
        )
    return scheme


def open_transport(
    url: str,
    address: str,
    *,
    synchronous: str = "FULL",
    consumer_id: str | None = None,
    tls: TlsContextFactory | None = None,
    heartbeat: int | None = None,
) -> MessagingService:
    """The messaging service at ``url`` for the node whose address is ``address``.

    ``consumer_id`` names the consumer to the transport (a node process passes its worker id,
    so that a process taking over from it can release what it held). ``tls`` makes the TLS
    context of an ``amqps://`` URL (see :mod:`messaging.tls`). ``heartbeat`` (seconds) is an
    AMQP consumer connection's (a node process passes a quarter of its lease).
    """
    scheme = transport_scheme(url)
    if scheme in AMQP_SCHEMES:
        try:
            from messaging.amqp import AmqpMessaging
        except ImportError as error:
            raise TransportUrlError(
                f"{url}: the AMQP transport needs pika (pip install 'fiberflow[amqp]'): {error}"
            ) from error
        return AmqpMessaging(url, address, consumer_id=consumer_id, tls=tls, heartbeat=heartbeat)
    from messaging.sqlqueue import SqlQueueMessaging

    return SqlQueueMessaging(url, address, synchronous=synchronous, consumer_id=consumer_id)


def purge_queues(url: str, addresses: Sequence[str]) -> None:
    """Delete the queues of ``addresses`` and everything in them (demos, benchmarks, tests)."""
    scheme = transport_scheme(url)
    if scheme in AMQP_SCHEMES:
        from messaging.amqp import delete_queues

        for address in addresses:
            delete_queues(url, address)
        return
    from messaging.sqlqueue import SqlQueueBroker

    broker = SqlQueueBroker(url)
    try:
        for address in addresses:
            broker.purge(address)
    finally:
        broker.close()
