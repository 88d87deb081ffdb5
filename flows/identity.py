"""A node's Ed25519 key pair, and where it finds its peers' public keys.

Every node signs every message it sends (its identity's ``signer``) and verifies every
message it receives against the public key of the node the message claims to come from (a
:class:`~messaging.signing.MessageVerifier` over :class:`StaticPeerKeys` or
:class:`NetworkMapPeerKeys`). The key pair lives in a PEM file the node creates on its first
start, with mode 0600 (readable by its owner only); a node refuses to start with a key file
others can read or write.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flows.errors import FiberflowError
from flows.network_map import NetworkMap, NetworkMapError, node_key
from messaging.service import Message
from messaging.signing import MessageSigner, PeerKeys

__all__ = [
    "KeyFileError",
    "NetworkMapPeerKeys",
    "NodeIdentity",
    "PeerKeys",
    "StaticPeerKeys",
    "load_or_create_identity",
]


class KeyFileError(FiberflowError):
    """The node's key file cannot be used; the message says why."""


class NodeIdentity:
    """A node's name and private key: its :attr:`signer` signs what the node sends."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self.name = name
        self._key = private_key
        self.signer = MessageSigner(private_key)
        """Signs the node's messages (the node hands it to its outbox relay)."""
        self.public_key: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        """The raw 32-byte public key."""

    @classmethod
    def generate(cls, name: str) -> NodeIdentity:
        """A fresh identity held in memory only (test networks)."""
        return cls(name, Ed25519PrivateKey.generate())

    @property
    def private_key(self) -> Ed25519PrivateKey:
        """The private key (it signs the node's certificate request and its node-info)."""
        return self._key

    @property
    def public_key_hex(self) -> str:
        """The public key as hex (what the network map stores)."""
        return self.public_key.hex()

    def sign(self, message: Message, target: str) -> Message:
        """``message`` signed for ``target`` (see :meth:`MessageSigner.sign`)."""
        return self.signer.sign(message, target)

    def sign_bytes(self, data: bytes) -> bytes:
        """The node's Ed25519 signature of ``data`` (its node-info, for one)."""
        return self._key.sign(data)

    def mac_key(self) -> bytes:
        """A node-local secret for checkpoint MACs, derived from the private key."""
        raw = self._key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return hashlib.sha256(b"fiberflow-checkpoint-mac-v1" + raw).digest()


def load_or_create_identity(path: Path, name: str) -> NodeIdentity:
    """The identity in ``path``, creating the file (mode 0600) on first use."""
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it just now: use theirs
            return load_or_create_identity(path, name)
        with os.fdopen(descriptor, "wb") as output:
            output.write(pem)
        return NodeIdentity(name, key)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise KeyFileError(
            f"key file {path} has mode {mode:o}: others may read or change it; "
            f"make it readable by its owner only (chmod 600 {path})"
        )
    try:
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as error:
        raise KeyFileError(f"key file {path} is not a PEM private key: {error}") from error
    if not isinstance(loaded, Ed25519PrivateKey):
        raise KeyFileError(f"key file {path} holds a {type(loaded).__name__}, not an Ed25519 key")
    return NodeIdentity(name, loaded)


class StaticPeerKeys:
    """Public keys held in memory (the test network registers each node's)."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}

    def add(self, name: str, public_key: bytes) -> None:
        """Know ``name`` by ``public_key``."""
        self._keys[name] = public_key

    def public_key(self, name: str) -> bytes | None:
        """See :class:`PeerKeys`."""
        return self._keys.get(name)

    def refusal(self, name: str) -> str | None:
        """Nothing is refused here: a name is known or not."""
        return None


class NetworkMapPeerKeys:
    """Public keys from the network map directory.

    The map is read again at most every :attr:`RELOAD_SECONDS` when a sender is unknown, and
    at least every :attr:`REFRESH_SECONDS` anyway, so that a key whose node-info no longer
    verifies (expired, replaced, removed) stops being trusted within seconds.

    With a map that has a trust root, keys come only from node-infos that verify: a node whose
    node-info is refused has no key, so its messages fail authentication, with the reason.
    """

    RELOAD_SECONDS = 1.0
    REFRESH_SECONDS = 5.0

    def __init__(self, network_map: NetworkMap) -> None:
        self._map = network_map
        self._keys: dict[str, bytes] = {}
        self._refusals: dict[str, str] = {}
        self._loaded_at = -1e9

    def public_key(self, name: str) -> bytes | None:
        """See :class:`PeerKeys`."""
        age = time.monotonic() - self._loaded_at
        key = self._keys.get(name)
        if age > self.REFRESH_SECONDS or (key is None and age > self.RELOAD_SECONDS):
            self._reload()
            key = self._keys.get(name)
        return key

    def refusal(self, name: str) -> str | None:
        """Why ``name``'s node-info was refused at the last reading, or None."""
        return self._refusals.get(node_key(name))

    def _reload(self) -> None:
        self._loaded_at = time.monotonic()
        try:
            scan = self._map.scan()
        except NetworkMapError:
            return
        self._keys = {
            info.name: bytes.fromhex(info.public_key)
            for _, info in scan.accepted
            if info.public_key
        }
        self._refusals = {path.stem: reason for path, reason in scan.rejected}
