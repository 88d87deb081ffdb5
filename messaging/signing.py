"""Ed25519 signatures on transport messages: :class:`MessageSigner` and :class:`MessageVerifier`.

A node signs what it sends with its own key (its signer goes to the outbox relay) and checks
what it receives against the key of the node it claims to come from (its verifier, holding
the peers' keys).

The signature covers the message id, topic, sender, the *target* node and the data, so a
signed message cannot be given another id (moved to another session or sequence), another
claimed sender, another recipient or other contents without the signature failing. A
message replayed unchanged to its own recipient is a duplicate and is dropped by its id.
"""

from __future__ import annotations

from typing import Protocol

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from messaging.service import Message

__all__ = ["SIGNATURE_CONTEXT", "MessageSigner", "MessageVerifier", "PeerKeys", "signed_bytes"]

SIGNATURE_CONTEXT = "fiberflow-message-v1"
"""Domain separation: these signatures cannot be mistaken for signatures of anything else."""


def signed_bytes(message: Message, target: str) -> bytes:
    """The bytes a message's signature covers."""
    packed: bytes = msgpack.packb(
        [
            SIGNATURE_CONTEXT,
            message.message_id,
            message.topic,
            message.sender,
            target,
            message.data,
        ],
        use_bin_type=True,
    )
    return packed


class MessageSigner:
    """Signs the messages a node sends, with the node's private key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key

    def sign(self, message: Message, target: str) -> Message:
        """``message`` with its signature for ``target``."""
        return Message(
            message.message_id,
            message.topic,
            message.sender,
            message.data,
            self._key.sign(signed_bytes(message, target)),
        )


class PeerKeys(Protocol):
    """Where a node looks up the public key of a sender."""

    def public_key(self, name: str) -> bytes | None:
        """The raw public key of node ``name``, or None if it is not known."""

    def refusal(self, name: str) -> str | None:
        """Why node ``name``'s entry was refused (its node-info did not verify), or None."""


class MessageVerifier:
    """Checks that each message ``receiver`` gets was signed, for it, by its claimed sender."""

    def __init__(self, receiver: str, peers: PeerKeys) -> None:
        self.receiver = receiver
        self.peers = peers
        """The public keys senders are verified against."""

    def problem(self, message: Message) -> str | None:
        """Why ``message`` must be refused, or None if it is genuine."""
        public_key = self.peers.public_key(message.sender)
        if public_key is None:
            refusal = self.peers.refusal(message.sender)
            if refusal is not None:
                return f"unknown sender {message.sender!r}: its node-info is refused: {refusal}"
            return f"unknown sender {message.sender!r}: not in the network map"
        if not message.signature:
            return f"message from {message.sender} is not signed"
        try:
            Ed25519PublicKey.from_public_bytes(public_key).verify(
                message.signature, signed_bytes(message, self.receiver)
            )
        except (InvalidSignature, ValueError):
            return (
                f"bad signature: the message is not what {message.sender} signed for "
                f"{self.receiver} (forged sender, tampered contents or id, or meant for another "
                "node)"
            )
        return None
