"""Message authentication: an HMAC-SHA256 tag per message, with a key per pair of nodes.

A node tags what it sends (its :class:`MessageAuthenticator` goes to the outbox relay) and
checks what it receives (its :class:`MessageVerifier`). The key of a tag is the directional
key K(sender->target) that the two nodes agreed through their published X25519 agreement
keys (:mod:`messaging.pair_keys`): only the sender and the target can compute it.

The tag covers :func:`authenticated_bytes`: the message id, topic, sender, the *target* node
and the data, so a tagged message cannot be given another id (moved to another session or
sequence), another claimed sender, another recipient or other contents without the tag
failing. A message replayed unchanged to its own recipient is a duplicate and is dropped by
its id.

What a tag proves is weaker than the Ed25519 signature it replaced, in one way: it shows the
message was made by the sender *or by the target itself* (both hold the key), so the target
cannot prove to anyone else that the sender sent it (no non-repudiation), and a node whose
private key leaks can be sent messages claiming to come from any of its peers. No node can
make a message that *another* node accepts as coming from a third (see docs/security.md).
"""

from __future__ import annotations

import hmac

import msgpack

from messaging.pair_keys import AgreementIdentity, PairKey, PairKeyCache, PeerKeys
from messaging.service import Message, TransportError

__all__ = [
    "AUTHENTICATION_CONTEXT",
    "TAG_BYTES",
    "CannotAuthenticateError",
    "MessageAuthenticator",
    "MessageVerifier",
    "PeerKeys",
    "authenticated_bytes",
]

AUTHENTICATION_CONTEXT = "fiberflow-message-mac-v1"
"""Domain separation: the first field of what every tag covers."""
TAG_BYTES = 32
"""The length of a tag (HMAC-SHA256)."""


def authenticated_bytes(message: Message, target: str) -> bytes:
    """The bytes a message's tag covers: context, id, topic, sender, target and data."""
    packed: bytes = msgpack.packb(
        [
            AUTHENTICATION_CONTEXT,
            message.message_id,
            message.topic,
            message.sender,
            target,
            message.data,
        ],
        use_bin_type=True,
    )
    return packed


class CannotAuthenticateError(TransportError):
    """No key is shared with the target yet (not in the network map, or refused there).

    A :class:`~messaging.service.TransportError`, so relays keep the message in the outbox
    and try again with their backoff, exactly as for a peer that cannot be reached.
    """


class MessageAuthenticator:
    """Tags the messages a node sends, each with the key it shares with the message's target."""

    def __init__(self, pair_keys: PairKeyCache) -> None:
        self.pair_keys = pair_keys
        """The node's keys with each peer."""

    @classmethod
    def of(cls, identity: AgreementIdentity, peers: PeerKeys) -> MessageAuthenticator:
        """An authenticator for ``identity``'s node, with keys of its own."""
        return cls(PairKeyCache(identity, peers))

    def problem(self, target: str) -> str | None:
        """Why messages for ``target`` cannot be authenticated now, or None if they can."""
        if self.pair_keys.lookup(target) is not None:
            return None
        return f"cannot authenticate messages for {target}: {self.pair_keys.unknown_reason(target)}"

    def authenticate(self, message: Message, target: str) -> Message:
        """``message`` with its tag for ``target``.

        Raises :class:`CannotAuthenticateError` (a transport error: the relay retries) if no
        key is shared with ``target`` yet.
        """
        pair = self.pair_keys.lookup(target)
        if pair is None:
            raise CannotAuthenticateError(
                f"cannot authenticate messages for {target}: "
                f"{self.pair_keys.unknown_reason(target)}"
            )
        return Message(
            message.message_id,
            message.topic,
            message.sender,
            message.data,
            hmac.digest(pair.sending, authenticated_bytes(message, target), "sha256"),
        )


class MessageVerifier:
    """Checks that each message the node gets was tagged, for it, by its claimed sender."""

    def __init__(self, pair_keys: PairKeyCache) -> None:
        self.pair_keys = pair_keys
        """The node's keys with each peer (shared with its authenticator)."""
        self.receiver = pair_keys.identity.name
        """The node whose inbound messages are checked."""

    @classmethod
    def of(cls, identity: AgreementIdentity, peers: PeerKeys) -> MessageVerifier:
        """A verifier for ``identity``'s node, with keys of its own."""
        return cls(PairKeyCache(identity, peers))

    def problem(self, message: Message) -> str | None:
        """Why ``message`` must be refused, or None if it is genuine.

        A tag that does not check is checked once more if the peers' keys changed since they
        were last read (the sender published a new key: its messages are not refused while
        this node still holds the old one).
        """
        pair = self.pair_keys.lookup(message.sender)
        if pair is None:
            reason = self.pair_keys.unknown_reason(message.sender)
            return f"unknown sender {message.sender!r}: {reason}"
        if not message.tag:
            return f"message from {message.sender} is not authenticated: it carries no tag"
        covered = authenticated_bytes(message, self.receiver)
        if _tag_checks(pair, covered, message.tag):
            return None
        if self.pair_keys.peers.reread_if_changed(message.sender):
            pair = self.pair_keys.lookup(message.sender)
            if pair is None:
                reason = self.pair_keys.unknown_reason(message.sender)
                return f"unknown sender {message.sender!r}: {reason}"
            if _tag_checks(pair, covered, message.tag):
                return None
        return (
            f"bad tag: the message is not what {message.sender} authenticated for "
            f"{self.receiver} (forged sender, tampered contents or id, or meant for another "
            "node)"
        )


def _tag_checks(pair: PairKey, covered: bytes, tag: bytes) -> bool:
    """True if ``tag`` is the HMAC of ``covered`` under ``pair``'s receiving key."""
    return hmac.compare_digest(hmac.digest(pair.receiving, covered, "sha256"), tag)
