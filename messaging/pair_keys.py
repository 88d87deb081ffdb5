"""Per-peer-pair message keys: a node's X25519 agreement key and the keys it shares with peers.

Every node has a static X25519 key pair, its *agreement key*, derived from its Ed25519
identity key (:func:`derive_agreement_key`: HKDF-SHA256 of the raw Ed25519 private bytes
under its own label), so no key file is added. Its public half is published in the node's
node-info (``agreement_key``), beside the Ed25519 key; with a network root the node-info's
signature covers it, so it is exactly as trusted as the identity key.

Two nodes A and B agree on one X25519 secret, and derive a key for each direction from it
(:func:`directional_key`)::

    K(A->B) = HKDF-SHA256(X25519(a, B), salt=b"fiberflow-message-mac-v1",
                          info=[A's name, A's agreement key, B's name, B's agreement key])

A computes it with its private key and B's public key, B with its own and A's: the same 32
bytes. K(A->B) differs from K(B->A) (the order in ``info``), so a message cannot be
reflected back to its sender as if it came from the other side; a third node C shares
neither key, so it cannot make a message that B accepts as from A.

:class:`PairKeyCache` computes each peer's pair of keys once (one X25519 and two HKDFs) and
keeps it for as long as the peer's published agreement key stays the same; it asks the
:class:`PeerKeys` on every use, so a peer whose node-info changes, or stops verifying, is
followed as soon as the peer keys notice (within seconds, see
:class:`~flows.network.identity.NetworkMapPeerKeys`).
"""

from __future__ import annotations

import struct
from typing import Protocol

import attrs
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "AGREEMENT_KEY_BYTES",
    "AGREEMENT_KEY_LABEL",
    "PAIR_KEY_BYTES",
    "PAIR_KEY_SALT",
    "AgreementIdentity",
    "PairKey",
    "PairKeyCache",
    "PeerKeys",
    "agreement_public_bytes",
    "derive_agreement_key",
    "directional_key",
    "pair_key",
]

AGREEMENT_KEY_LABEL = b"fiberflow-x25519-v1"
"""Domain separation: the HKDF ``info`` that turns an Ed25519 private key into an X25519 one."""
PAIR_KEY_SALT = b"fiberflow-message-mac-v1"
"""The HKDF salt of every directional message key."""
AGREEMENT_KEY_BYTES = 32
"""The length of a raw X25519 public key."""
PAIR_KEY_BYTES = 32
"""The length of a directional message key (an HMAC-SHA256 key)."""


class PeerKeys(Protocol):
    """Where a node looks up the agreement keys of its peers (the network map, in a process)."""

    def agreement_key(self, name: str) -> bytes | None:
        """The raw X25519 public key node ``name`` published, or None if it is not known."""

    def refusal(self, name: str) -> str | None:
        """Why node ``name``'s entry was refused (its node-info did not verify), or None."""

    def reread_if_changed(self, name: str) -> bool:
        """Read the keys again now if their source or node ``name``'s entry changed since.

        True if it did (a key may have changed: a message that failed its check may pass
        now). Asked when a known peer's message fails its check, so a peer that rotated its
        key is followed at once rather than at the next periodic reading.
        """


class AgreementIdentity(Protocol):
    """What a node's pair keys are computed from: its name and its agreement key pair."""

    name: str

    @property
    def agreement_private_key(self) -> X25519PrivateKey:
        """The node's X25519 private key."""

    @property
    def agreement_key(self) -> bytes:
        """The node's raw X25519 public key (what its node-info publishes)."""


def derive_agreement_key(identity_key: Ed25519PrivateKey) -> X25519PrivateKey:
    """The node's X25519 private key, derived from its Ed25519 identity key.

    HKDF-SHA256 over the raw 32 private bytes, with :data:`AGREEMENT_KEY_LABEL` as ``info``:
    the same identity key always gives the same agreement key, and the two keys are used for
    different algorithms without one revealing anything about the other.
    """
    raw = identity_key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=AGREEMENT_KEY_LABEL).derive(
        raw
    )
    return X25519PrivateKey.from_private_bytes(seed)


def agreement_public_bytes(private_key: X25519PrivateKey) -> bytes:
    """The raw 32-byte public half of ``private_key``."""
    return private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def directional_key(
    shared_secret: bytes, sender: str, sender_key: bytes, target: str, target_key: bytes
) -> bytes:
    """K(sender->target): the HMAC key of messages ``sender`` sends to ``target``.

    HKDF-SHA256 of the two nodes' X25519 secret, salted with :data:`PAIR_KEY_SALT`, with
    ``info`` the length-prefixed sender name, sender agreement key, target name and target
    agreement key, in that order (so the two directions get different keys).
    """
    info = b"".join(
        struct.pack(">I", len(part)) + part
        for part in (sender.encode(), sender_key, target.encode(), target_key)
    )
    return HKDF(
        algorithm=hashes.SHA256(), length=PAIR_KEY_BYTES, salt=PAIR_KEY_SALT, info=info
    ).derive(shared_secret)


@attrs.frozen
class PairKey:
    """The two directional keys a node shares with one peer, for one agreement key of it."""

    peer_agreement_key: bytes
    """The peer's agreement key these keys were computed for."""
    sending: bytes = attrs.field(repr=False)
    """K(this node -> peer): tags the messages this node sends the peer."""
    receiving: bytes = attrs.field(repr=False)
    """K(peer -> this node): checks the messages the peer sends this node."""


def pair_key(identity: AgreementIdentity, peer: str, peer_agreement_key: bytes) -> PairKey:
    """Both directional keys between ``identity``'s node and node ``peer``.

    Raises ValueError if ``peer_agreement_key`` is not a usable X25519 public key (not 32
    bytes, or a low-order point whose shared secret would be all zeros).
    """
    if len(peer_agreement_key) != AGREEMENT_KEY_BYTES:
        raise ValueError(f"it is {len(peer_agreement_key)} bytes, not {AGREEMENT_KEY_BYTES}")
    try:
        shared = identity.agreement_private_key.exchange(
            X25519PublicKey.from_public_bytes(peer_agreement_key)
        )
    except ValueError as error:  # OpenSSL refuses a low-order point (an all-zero secret)
        raise ValueError(f"no shared secret can be agreed with it ({error})") from None
    own = identity.agreement_key
    return PairKey(
        peer_agreement_key,
        sending=directional_key(shared, identity.name, own, peer, peer_agreement_key),
        receiving=directional_key(shared, peer, peer_agreement_key, identity.name, own),
    )


class PairKeyCache:
    """The pair keys of one node with each of its peers, each computed once per agreement key.

    Every lookup asks :attr:`peers` for the peer's current agreement key (a dictionary look-up
    in the peer keys, which re-read the network map on their own schedule) and recomputes the
    pair only when that key changed; a peer the peer keys no longer know (removed, or its
    node-info refused) has no keys from that moment. Safe to use from several threads: an
    entry is replaced whole, and two threads computing the same entry compute the same bytes.
    """

    def __init__(self, identity: AgreementIdentity, peers: PeerKeys) -> None:
        self.identity = identity
        """The node whose pair keys these are."""
        self.peers = peers
        """Where the peers' agreement keys come from."""
        self._pairs: dict[str, PairKey] = {}
        self._unusable: dict[str, tuple[bytes, str]] = {}
        self.computed = 0
        """Pairs computed so far (one X25519 each): for tests and statistics."""

    def lookup(self, peer: str) -> PairKey | None:
        """The keys shared with ``peer`` now, or None (:meth:`unknown_reason` says why)."""
        agreement_key = self.peers.agreement_key(peer)
        if agreement_key is None:
            return None
        pair = self._pairs.get(peer)
        if pair is not None and pair.peer_agreement_key == agreement_key:
            return pair
        unusable = self._unusable.get(peer)
        if unusable is not None and unusable[0] == agreement_key:
            return None
        try:
            pair = pair_key(self.identity, peer, agreement_key)
        except ValueError as error:
            self._pairs.pop(peer, None)
            self._unusable[peer] = (agreement_key, str(error))
            return None
        self._unusable.pop(peer, None)
        self._pairs[peer] = pair
        self.computed += 1
        return pair

    def unknown_reason(self, peer: str) -> str:
        """Why :meth:`lookup` has no keys for ``peer`` (call it after a lookup gave None)."""
        refusal = self.peers.refusal(peer)
        if refusal is not None:
            return f"its node-info is refused: {refusal}"
        agreement_key = self.peers.agreement_key(peer)
        unusable = self._unusable.get(peer)
        if agreement_key is not None and unusable is not None and unusable[0] == agreement_key:
            return f"its agreement_key cannot be used: {unusable[1]}"
        return "not in the network map"
