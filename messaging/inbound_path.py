"""The inbound path: a transport's session messages on their way to the state machine.

Every message a node's transport delivers passes here, in this order:

1. the partition filter: a worker of a node run by several workers takes only the messages of
   the partitions its lease holds; one of another partition (the transport claimed it before a
   hand-over) is given back to the transport for the worker that holds it;
2. the tag check: :class:`~messaging.authentication.MessageVerifier` says what is wrong with
   the message's authentication tag (its claimed sender, its key), if anything; a message that
   fails is still delivered, with the problem, so the state machine dead-letters it with the
   reason (never silently dropped, never run);
3. the delivery: the message becomes an :class:`~statemachine.ports.InboundMessage` for the
   state machine manager (its ``deliver``), and the node's loop is woken.

After the commit that consumed it, the manager acknowledges the message through
:meth:`InboundPath.acknowledge`, which settles the transport delivery it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from messaging.authentication import MessageVerifier
from messaging.service import (
    SESSION_TOPIC,
    Message,
    MessagingService,
    PartitionedInbound,
    as_partitioned,
)
from statemachine.partitions import partition_of_message
from statemachine.ports import InboundMessage


class InboundSink(Protocol):
    """Where checked messages go: the state machine manager."""

    def deliver(self, message: InboundMessage) -> None:
        """Queue an inbound message (safe from the transport's thread)."""


class InboundPath:
    """One node's inbound path (see the module docstring)."""

    def __init__(
        self,
        transport: MessagingService,
        verifier: MessageVerifier,
        wake: Callable[[], None],
        owner: str,
    ) -> None:
        """The path from ``transport``, checking tags with ``verifier``; ``wake`` on each message.

        ``owner`` names the node in errors. Nothing is delivered until :meth:`connect`.
        """
        self.transport = transport
        self.verifier = verifier
        self.wake = wake
        self.owner = owner
        self.partitions: frozenset[int] | None = None
        """The partitions whose messages pass: None for a node run as one process (all)."""
        self._sink: InboundSink | None = None

    def connect(self, sink: InboundSink) -> None:
        """Hand every session message, checked, to ``sink`` (the state machine manager)."""
        self._sink = sink
        self.transport.add_handler(SESSION_TOPIC, self.on_message)

    def on_message(self, message: Message) -> None:
        """The transport's handler: filter, check, deliver, wake (see the module docstring)."""
        partitions = self.partitions
        if (
            partitions is not None
            and partition_of_message(message.message_id, message.sender) not in partitions
        ):
            self.partitioned().release(message)  # another worker's: give it back
            return
        sink = self._sink
        assert sink is not None, "the inbound path delivers only once connected"
        problem = self.verifier.problem(message)
        sink.deliver(
            InboundMessage(message.message_id, message.sender, message.data, problem, message)
        )
        self.wake()

    def acknowledge(self, inbound: InboundMessage) -> None:
        """Settle the transport delivery an inbound message came from (after its commit)."""
        if isinstance(inbound.delivery, Message):
            self.transport.acknowledge(inbound.delivery)

    def consume_partitions(self, partitions: frozenset[int]) -> None:
        """Take only the messages of ``partitions`` from now on (a worker's, from its lease)."""
        self.partitions = partitions
        self.partitioned().consume_partitions(partitions)

    def partitioned(self) -> PartitionedInbound:
        """The transport, as one that routes messages by partition (workers need one)."""
        return as_partitioned(self.transport, self.owner)
