"""The ``MessagingService`` protocol: what every transport offers the node.

Contract (checked by the conformance suite in ``tests/messaging_conformance.py``):

* ``send(message, target)`` returns only once the transport has *durably* taken the message
  (queued in memory for the test double, a committed row for the SQL queue, a publisher
  confirm for AMQP). If it cannot take it, it raises :class:`TransportError` and the caller
  keeps the message (the outbox relay retries).
* Each message is delivered to the handler registered for its topic, at least once. A
  delivered message stays the transport's responsibility until ``acknowledge(delivered)``
  is called with the very ``Message`` the handler got: if the consumer stops first, the
  message is delivered again. Acknowledging settles that one delivery only (its
  ``receipt``), never another copy with the same id: a forged or stale copy that is
  dead-lettered cannot take a genuine one with it.
* Delivery order is not guaranteed; the session protocol restores order by sequence number.
* ``send_batch(items)`` takes several messages at once: when it returns, every one was
  durably taken; when it raises :class:`TransportError`, the caller must assume none was
  (some may have been: sending again is safe, receivers drop duplicates by id).
* Messages travel as frames (:mod:`messaging.frame`). A frame the receiver cannot decode
  (including one whose text fields are over their limits in :mod:`statemachine.limits`) is
  never handed to a handler: it goes to the transport's dead-letter store with the reason and
  is acknowledged.
* A starting consumer never takes deliveries a live consumer holds; a dead consumer's
  deliveries come back when the transport notices (its connection closed, its lease on them
  expired) or at once through ``release_deliveries_of``.
* A body over the frame limit (``limits.FRAME_BYTES`` unless the transport was given another)
  is refused on its length, before anything decodes it: dead-lettered with a reason naming its
  size and the limit (a transport may keep only a bounded prefix of it), and acknowledged.
* A message whose topic has no handler is dead-lettered with the reason (naming the topic)
  and acknowledged; it is never handed to another topic's handler.
* Writing a dead letter never fails because of what the message holds: the stored reason and
  ids are bounded copies (:mod:`foundation.bounded`).
* ``acknowledge`` may be called from any thread; handlers are called on the transport's own
  thread (the in-memory double calls them from ``InMemoryNetwork.deliver``).
* Sending to an address with no queue raises :class:`TransportError` (the relay retries:
  the target may not have started yet).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, cast

import attrs

SESSION_TOPIC = "platform.session"
"""The topic every flow session message travels on."""


@attrs.frozen
class Message:
    """A transport message: an id for dedup, a topic, the sending node and opaque bytes.

    ``tag`` authenticates the message: the sender's HMAC-SHA256 of it, with the key the
    sender shares with the target (see :mod:`messaging.authentication`); empty on messages
    that are not authenticated (transport tests).
    """

    message_id: str
    topic: str
    sender: str
    data: bytes
    tag: bytes = b""
    receipt: object = attrs.field(default=None, eq=False, repr=False)
    """Set by the transport on a delivered message: its handle for this one delivery (not
    part of the frame, not compared)."""


MessageHandler = Callable[[Message], None]
"""Called by the transport for each delivered message."""


class TransportError(Exception):
    """The transport could not take or deliver a message; nothing was lost, try again."""


class TransportAuthenticationError(TransportError):
    """The transport refused this node's credentials (a wrong password, no access).

    Final: trying again cannot help, so nothing retries it; a node process stops with it.
    """


def fatal_transport_error(transport: object) -> TransportAuthenticationError | None:
    """Why ``transport`` can no longer work, if it says so (its ``fatal_error``), else None.

    A transport that can be refused for good (RabbitMQ refusing the login) has a
    ``fatal_error`` property; the others never fail for good and have none.
    """
    error = getattr(transport, "fatal_error", None)
    return error if isinstance(error, TransportAuthenticationError) else None


class MessagingService(Protocol):
    """A node's connection to the network. See the module docstring for the contract."""

    @property
    def my_address(self) -> str:
        """The address other nodes send to (the node's name)."""

    @property
    def consumer_id(self) -> str:
        """Who this consumer is to the transport (a node process passes its worker id)."""

    def release_deliveries_of(self, consumer_ids: Sequence[str]) -> None:
        """Deliver again now what consumers known to be dead still held unacknowledged.

        A node calls this with the workers it took over from. Transports whose broker gives
        a dead consumer's deliveries back by itself (AMQP, the test double) do nothing.
        """

    def start(self) -> None:
        """Begin delivering messages to the handlers."""

    def stop(self) -> None:
        """Stop delivering; unacknowledged messages will be delivered again later."""

    def add_handler(self, topic: str, callback: MessageHandler) -> None:
        """Deliver messages of ``topic`` to ``callback``."""

    def send(self, message: Message, target: str) -> None:
        """Hand ``message`` to the transport for ``target``; return once durably taken."""

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """Hand several (message, target) pairs over; all taken, or TransportError."""

    def acknowledge(self, delivered: Message) -> None:
        """Settle a delivery (a message the handler got): it is never delivered again."""


class PartitionedInbound(Protocol):
    """A transport whose consumer can take some partitions of its node's flows only.

    For a node run by several workers (:mod:`persistence.lease`): each message is routed to
    the partition of its target flow (:func:`statemachine.partitions.partition_of_message`,
    computed from its id and sender, before anything decodes it), and each worker consumes
    the partitions it holds. Implemented by the SQL queue; a node refuses to run as workers
    on a transport without it.
    """

    def consume_partitions(self, partitions: frozenset[int] | None) -> None:
        """From now on take only messages of ``partitions`` (None: every message).

        A delivery of another partition that still comes (claimed before the change) is not
        handed to a handler: it goes back to its partition.
        """

    def release(self, delivered: Message) -> None:
        """Give a delivery back unsettled: it is delivered again to its partition's holder."""


def as_partitioned(transport: object, who: str) -> PartitionedInbound:
    """``transport`` as a :class:`PartitionedInbound`.

    Raises ValueError, naming the transport and ``who`` needs it, if it cannot route by
    partition (a worker of a node run by several workers needs it to).
    """
    if not (hasattr(transport, "consume_partitions") and hasattr(transport, "release")):
        raise ValueError(
            f"{who}: a worker of a node run by several workers needs a transport that routes "
            f"messages by partition (the SQL queue, RabbitMQ); {type(transport).__name__} "
            "does not"
        )
    return cast(PartitionedInbound, transport)
