"""The broker's topology: exchanges, each node's queues, and publishing a frame to one.

Queues (durable, ``x-queue-type: classic``), named after the node key (:func:`node_key`):

* ``p2p.inbound.<node key>.<pp>``, one per partition ``pp`` (``00`` to ``15``) of the node's
  flows (:mod:`statemachine.partitions`): the node's inbound messages, as frames
  (:mod:`messaging.frame`), each a persistent message whose ``message_id`` property is the
  message id. A sender computes a message's partition from its id and sender
  (:func:`~statemachine.partitions.partition_of_message`) and publishes it to that
  partition's queue, so each worker of a node run by several workers consumes only the
  queues of its partitions. A node declares its queues when its
  :class:`~messaging.amqp.consumer.AmqpMessaging` is built, so a send to a node that has
  never started is unroutable and raises :class:`~messaging.service.TransportError`.
* ``p2p.inbound.<node key>``: the node's inbound queue before partitions (and where tools
  inject raw frames): still declared and consumed, by the holder of partition 0, which
  forwards each message to its partition's queue.
* ``p2p.deadletter.<node key>``: frames the node could not take (undecodable, over the frame
  limit, or of a topic it has no handler for), each with the reason in its
  ``x-fiberflow-reason`` header (cut to ``limits.DEAD_LETTER_REASON_CHARS``, so that the
  header always fits). A body over the frame limit is refused on its length, before it is
  decoded, and only its first ``limits.DEAD_LETTER_PREFIX_BYTES`` are kept.

They are bound to a durable direct exchange, ``p2p.inbound`` and ``p2p.deadletter``, with the
queue name as routing key. Sending publishes to ``p2p.inbound`` (routing key: the target's
queue), ``mandatory``, in AMQP transactions (:mod:`messaging.amqp.publisher`).
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlsplit, urlunsplit

import pika

from messaging.amqp.connection import Channel
from statemachine.partitions import PARTITIONS, partition_of_message

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


def node_key(address: str) -> str:
    """The key naming the queues of the node at ``address`` (32 hex digits)."""
    return hashlib.sha256(address.encode()).hexdigest()[:32]


def queue_name(address: str) -> str:
    """The inbound queue of the node at ``address``: ``p2p.inbound.<node key>``.

    The node key is the start of the SHA-256 of the address for now; it will become the hash
    of the node's public key once nodes have keys.
    """
    return INBOUND_PREFIX + node_key(address)


def partition_queue_name(address: str, partition: int) -> str:
    """The inbound queue of partition ``partition`` of ``address``'s flows."""
    return f"{queue_name(address)}.{partition:02d}"


def inbound_queue_names(address: str) -> list[str]:
    """Every inbound queue of ``address``: the one from before partitions, then each one's."""
    return [queue_name(address)] + [partition_queue_name(address, p) for p in range(PARTITIONS)]


def message_queue_name(address: str, message_id: str, sender: str) -> str:
    """The queue of ``address`` a message with this id from ``sender`` is published to."""
    return partition_queue_name(address, partition_of_message(message_id, sender))


def dead_letter_queue_name(address: str) -> str:
    """The dead-letter queue of the node at ``address``: ``p2p.deadletter.<node key>``."""
    return DEAD_LETTER_PREFIX + node_key(address)


def declare_queues(channel: Channel, address: str) -> None:
    """Make sure the exchanges, the queues of ``address`` and their bindings exist."""
    for exchange in (INBOUND_EXCHANGE, DEAD_LETTER_EXCHANGE):
        channel.exchange_declare(exchange, exchange_type="direct", durable=True)
    for exchange, name in [
        *((INBOUND_EXCHANGE, inbound) for inbound in inbound_queue_names(address)),
        (DEAD_LETTER_EXCHANGE, dead_letter_queue_name(address)),
    ]:
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
    """Publish ``body`` persistently and ``mandatory`` to ``queue`` through ``exchange``.

    On a channel in publisher-confirm mode it returns once confirmed, and raises
    ``pika.exceptions.UnroutableError`` if ``queue`` is not bound to the exchange. On a
    transactional channel it returns at once: the ``tx_commit`` that follows is the
    confirmation, and an unroutable message comes back through the channel's return callback
    (see :mod:`messaging.amqp.publisher`).
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
