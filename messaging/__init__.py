"""Messaging: the ``MessagingService`` protocol, the session-message codec and transports.

Transports: :mod:`messaging.inmemory` (a deterministic test double with fault injection).
The outbox relay (:mod:`messaging.outbox_relay`) moves committed outbox rows to a transport.
"""

from messaging.service import SESSION_TOPIC, Message, MessagingService, TransportError

__all__ = ["SESSION_TOPIC", "Message", "MessagingService", "TransportError"]
