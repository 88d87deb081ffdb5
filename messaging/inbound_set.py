"""A node consuming its inbound and the inbounds it moved away from, as one transport.

When a node of the peer-to-peer topology moves its inbound (a new broker, vhost or queue
database), it publishes the new address in its node-info; peers' bridges follow within about
a second. Whatever a peer sent to the old address before it saw the move is still there, so
the node keeps consuming its former inbounds (``former_inbounds`` in its config) until the
operator sees them empty and removes them. :class:`InboundSet` presents the current inbound
and the former ones as one :class:`~messaging.service.MessagingService`: messages from all of
them reach the node's handlers, each acknowledgement goes back to the transport that
delivered the message, and sends go through the current inbound's transport.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from messaging.service import (
    Message,
    MessageHandler,
    MessagingService,
    TransportAuthenticationError,
    as_partitioned,
    fatal_transport_error,
)

__all__ = ["InboundSet"]


@attrs.frozen
class _Receipt:
    """Which transport delivered a message, and its own receipt for it."""

    transport: MessagingService
    inner: object


class InboundSet:
    """The current inbound and former ones as one transport (see the module docstring)."""

    def __init__(self, current: MessagingService, former: Sequence[MessagingService]) -> None:
        """Consume ``current`` and every one of ``former`` (same node address)."""
        for transport in former:
            if transport.my_address != current.my_address:
                raise ValueError(
                    f"a former inbound of {current.my_address} is {transport.my_address}'s"
                )
        self.current = current
        self.former = list(former)

    @property
    def _all(self) -> list[MessagingService]:
        return [self.current, *self.former]

    @property
    def fatal_error(self) -> TransportAuthenticationError | None:
        """The first inbound's reason to stop for good, if one has one."""
        for transport in self._all:
            error = fatal_transport_error(transport)
            if error is not None:
                return error
        return None

    @property
    def my_address(self) -> str:
        """The node's address."""
        return self.current.my_address

    @property
    def consumer_id(self) -> str:
        """The current inbound's consumer id."""
        return self.current.consumer_id

    def release_deliveries_of(self, consumer_ids: Sequence[str]) -> None:
        """Release dead consumers' deliveries on every inbound."""
        for transport in self._all:
            transport.release_deliveries_of(consumer_ids)

    def start(self) -> None:
        """Start consuming every inbound."""
        for transport in self._all:
            transport.start()

    def stop(self) -> None:
        """Stop every inbound (each one even if another fails to stop)."""
        errors: list[BaseException] = []
        for transport in self._all:
            try:
                transport.stop()
            except Exception as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def add_handler(self, topic: str, callback: MessageHandler) -> None:
        """Deliver ``topic`` messages of every inbound to ``callback``."""
        for transport in self._all:
            transport.add_handler(topic, _tagging(transport, callback))

    def send(self, message: Message, target: str) -> None:
        """Send through the current inbound's transport."""
        self.current.send(message, target)

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """Send through the current inbound's transport."""
        self.current.send_batch(items)

    def acknowledge(self, delivered: Message) -> None:
        """Settle the delivery on the transport that delivered it."""
        transport, inner = self._origin(delivered)
        transport.acknowledge(inner)

    def consume_partitions(self, partitions: frozenset[int] | None) -> None:
        """Take only ``partitions``' messages on every inbound (see ``PartitionedInbound``).

        Raises ValueError if one of the inbounds cannot route by partition.
        """
        for transport in self._all:
            as_partitioned(transport, f"inbound of {self.my_address}").consume_partitions(
                partitions
            )

    def release(self, delivered: Message) -> None:
        """Give the delivery back, unsettled, to the transport that delivered it."""
        transport, inner = self._origin(delivered)
        as_partitioned(transport, f"inbound of {self.my_address}").release(inner)

    def _origin(self, delivered: Message) -> tuple[MessagingService, Message]:
        receipt = delivered.receipt
        if not isinstance(receipt, _Receipt):
            raise ValueError(f"{delivered.message_id} was not delivered by this inbound set")
        return receipt.transport, attrs.evolve(delivered, receipt=receipt.inner)


def _tagging(transport: MessagingService, callback: MessageHandler) -> MessageHandler:
    """``callback`` for messages of ``transport``, their receipts tagged with it."""

    def deliver(message: Message) -> None:
        callback(attrs.evolve(message, receipt=_Receipt(transport, message.receipt)))

    return deliver
