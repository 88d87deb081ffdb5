"""Ed25519 signatures on transport messages.

The signature covers the message id, topic, sender, the *target* node and the data, so a
signed message cannot be given another id (moved to another session or sequence), another
claimed sender, another recipient or other contents without the signature failing. A
message replayed unchanged to its own recipient is a duplicate and is dropped by its id.
"""

from __future__ import annotations

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from messaging.service import Message

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


def sign(message: Message, target: str, key: Ed25519PrivateKey) -> Message:
    """``message`` with its signature for ``target``."""
    return Message(
        message.message_id,
        message.topic,
        message.sender,
        message.data,
        key.sign(signed_bytes(message, target)),
    )


def verification_problem(message: Message, target: str, public_key: bytes | None) -> str | None:
    """Why ``message`` (received by ``target``) must be refused, or None if it is genuine."""
    if public_key is None:
        return f"unknown sender {message.sender!r}: not in the network map"
    if not message.signature:
        return f"message from {message.sender} is not signed"
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(
            message.signature, signed_bytes(message, target)
        )
    except (InvalidSignature, ValueError):
        return (
            f"bad signature: the message is not what {message.sender} signed for {target} "
            "(forged sender, tampered contents or id, or meant for another node)"
        )
    return None
