"""A node's key pairs, and where it finds its peers' public keys.

A node's identity is an Ed25519 key pair: it signs the node's node-info and its certificate
request. From it the node derives its X25519 *agreement key*
(:func:`~messaging.pair_keys.derive_agreement_key`), published in its node-info beside the
Ed25519 key; with its peers' agreement keys it computes the per-peer keys that tag every
message it sends and check every message it receives (a
:class:`~messaging.authentication.MessageAuthenticator` and
:class:`~messaging.authentication.MessageVerifier` over :class:`StaticPeerKeys` or
:class:`NetworkMapPeerKeys`). The Ed25519 key pair lives in a PEM file the node creates on
its first start, with mode 0600 (readable by its owner only); a node refuses to start with a
key file others can read or write. The agreement key needs no file of its own.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import stat
import threading
import time
from pathlib import Path

import attrs
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from flows.errors import FiberflowError
from flows.network.map import NetworkMap, node_key
from messaging.pair_keys import PeerKeys, agreement_public_bytes, derive_agreement_key

log = logging.getLogger("fiberflow.identity")

__all__ = [
    "Counterparties",
    "KeyFileError",
    "NetworkMapPeerKeys",
    "NodeIdentity",
    "PeerKeys",
    "StaticPeerKeys",
    "load_identity",
    "load_or_create_identity",
]


class KeyFileError(FiberflowError):
    """The node's key file cannot be used; the message says why."""


class NodeIdentity:
    """A node's name, its Ed25519 private key and the X25519 agreement key derived from it."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        self.name = name
        self._key = private_key
        self.public_key: bytes = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        """The raw 32-byte Ed25519 public key."""
        self._agreement = derive_agreement_key(private_key)
        self._agreement_public = agreement_public_bytes(self._agreement)

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

    @property
    def agreement_private_key(self) -> X25519PrivateKey:
        """The X25519 private key derived from the identity key (it agrees the pair keys)."""
        return self._agreement

    @property
    def agreement_key(self) -> bytes:
        """The raw 32-byte X25519 public key (published in the node-info)."""
        return self._agreement_public

    @property
    def agreement_key_hex(self) -> str:
        """The agreement key as hex (the node-info's ``agreement_key``)."""
        return self._agreement_public.hex()

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
        # Written whole under a name of its own, then linked to ``path`` (which fails if the
        # file exists): a process starting at the same moment never reads half a key.
        draft = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.new")
        descriptor = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as output:
                output.write(pem)
                output.flush()
                os.fsync(output.fileno())
            os.link(draft, path)
        except FileExistsError:  # another process created it just now: use theirs
            return load_or_create_identity(path, name)
        finally:
            draft.unlink(missing_ok=True)
        return NodeIdentity(name, key)
    return load_identity(path, name)


def load_identity(path: Path, name: str) -> NodeIdentity:
    """The identity in the existing key file ``path`` (never created here).

    Raises :class:`KeyFileError` when the file is missing, others may read or change it, or
    it does not hold an unencrypted Ed25519 private key in PEM.
    """
    if not path.is_file():
        raise KeyFileError(f"key file {path} does not exist")
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


class Counterparties:
    """Which parties a node can reach: itself, and those its peer keys know (the network map)."""

    def __init__(self, our_name: str, peers: PeerKeys) -> None:
        self.our_name = our_name
        self.peers = peers

    def knows(self, name: str) -> bool:
        """True if the network map has an entry for party ``name`` that verified (or it is us)."""
        return name == self.our_name or self.peers.agreement_key(name) is not None

    def problem(self, name: str) -> str | None:
        """Why party ``name`` cannot be reached (not on the network map, its entry refused)."""
        if self.knows(name):
            return None
        refusal = self.peers.refusal(name)
        if refusal is not None:
            return f"its node-info on the network map is refused ({refusal})"
        return "it is not on this node's network map (check the name)"


class StaticPeerKeys:
    """Public keys held in memory (the test network registers each node's)."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}
        self._agreement_keys: dict[str, bytes] = {}

    def add(self, name: str, public_key: bytes, agreement_key: bytes) -> None:
        """Know ``name`` by its Ed25519 ``public_key`` and its X25519 ``agreement_key``."""
        self._keys[name] = public_key
        self._agreement_keys[name] = agreement_key

    def remove(self, name: str) -> None:
        """Forget ``name`` (a node that left the network)."""
        self._keys.pop(name, None)
        self._agreement_keys.pop(name, None)

    def public_key(self, name: str) -> bytes | None:
        """The raw Ed25519 public key of ``name``, or None if it is not known."""
        return self._keys.get(name)

    def agreement_key(self, name: str) -> bytes | None:
        """See :class:`PeerKeys`."""
        return self._agreement_keys.get(name)

    def refusal(self, name: str) -> str | None:
        """Nothing is refused here: a name is known or not."""
        return None

    def reread_if_changed(self, name: str) -> bool:
        """Nothing to read again: the keys are what :meth:`add` was given."""
        return False


class NetworkMapPeerKeys:
    """Public keys from the network map directory.

    The map is read again when a name is unknown and the map's directory or that name's file
    changed since the last reading (a node-info was published: a ``stat`` or two tell), or
    at most every :attr:`RELOAD_SECONDS` when a name is unknown, and at least every
    :attr:`REFRESH_SECONDS` anyway, so that a key whose node-info no longer
    verifies (expired, replaced, removed) stops being trusted within seconds, and a changed
    agreement key is followed as soon (the node's
    :class:`~messaging.pair_keys.PairKeyCache` recomputes the pair keys when it sees it).

    Keys come only from node-infos the map accepts: with a trust root, those that verify; in
    any map, only those publishing a usable ``agreement_key``. A node whose node-info is
    refused has no key, so its messages fail authentication, with the reason, and messages
    for it wait in the outbox. Safe to use from several threads (the relay's and the
    transport's): one reads the map while the others wait for its result.
    """

    RELOAD_SECONDS = 1.0
    REFRESH_SECONDS = 5.0

    def __init__(self, network_map: NetworkMap) -> None:
        self._map = network_map
        self._reading = _MapReading(keys={}, refusals={}, loaded_at=-1e9, stamp=None, files={})
        """The last reading, replaced whole once a new one is complete: a thread that finds
        it fresh also finds its keys (no reader sees a new time with the old keys)."""
        self._lock = threading.Lock()

    def public_key(self, name: str) -> bytes | None:
        """The raw Ed25519 public key of ``name``, or None if it is not known."""
        keys = self._lookup(name)
        return None if keys is None else keys[0]

    def agreement_key(self, name: str) -> bytes | None:
        """See :class:`PeerKeys`."""
        keys = self._lookup(name)
        return None if keys is None else keys[1]

    def refusal(self, name: str) -> str | None:
        """Why ``name``'s node-info was refused at the last reading, or None."""
        return self._reading.refusals.get(node_key(name))

    def reread_if_changed(self, name: str) -> bool:
        """See :class:`PeerKeys`: read again if the directory or ``name``'s file changed."""
        with self._lock:
            reading = self._reading
            if self._directory_stamp() == reading.stamp and not self._file_changed(reading, name):
                return False
            self._reload(reading)
            return True

    def _lookup(self, name: str) -> tuple[bytes | None, bytes] | None:
        reading = self._reading
        keys = reading.keys.get(name)
        if self._stale(reading, name, keys is None):
            with self._lock:
                reading = self._reading  # perhaps read by another thread while this one waited
                if self._stale(reading, name, keys is None):
                    reading = self._reload(reading)
            keys = reading.keys.get(name)
        return keys

    def _stale(self, reading: _MapReading, name: str, unknown: bool) -> bool:
        age = time.monotonic() - reading.loaded_at
        if age > self.REFRESH_SECONDS:
            return True
        return unknown and (
            age > self.RELOAD_SECONDS
            or self._directory_stamp() != reading.stamp
            or self._file_changed(reading, name)
        )

    def _file_changed(self, reading: _MapReading, name: str) -> bool:
        """True if ``name``'s node-info file is there and is not the one ``reading`` read.

        Publishing renames a new file into place (a new inode), so this holds for a file
        published after the reading listed the directory even within one tick of the
        directory's clock (coarse timestamps, a network file system's cached attributes),
        and never for a file the reading took or refused as it is.
        """
        key = node_key(name)
        try:
            found = (self._map.directory / f"{key}.json").stat()
        except OSError:
            return False
        return reading.files.get(key) != (found.st_ino, found.st_mtime_ns)

    def _file_stamps(self) -> dict[str, tuple[int, int]]:
        """Each node-info file's (inode, modification time), by node key (its stem)."""
        stamps: dict[str, tuple[int, int]] = {}
        try:
            paths = list(self._map.directory.glob("*.json"))
        except OSError:
            return stamps
        for path in paths:
            try:
                found = path.stat()
            except OSError:
                continue  # replaced or removed meanwhile: the next look sees it changed
            stamps[path.stem] = (found.st_ino, found.st_mtime_ns)
        return stamps

    def _directory_stamp(self) -> int | None:
        try:
            return self._map.directory.stat().st_mtime_ns
        except OSError:
            return None

    def _reload(self, previous: _MapReading) -> _MapReading:
        started = time.monotonic()
        # before the scan: a file published during it is seen changed at the next look
        stamp = self._directory_stamp()
        files = self._file_stamps()
        try:
            scan = self._map.scan()
        except Exception as error:  # the previous keys stand until the next reading is due
            log.warning("network map %s could not be read: %s", self._map.directory, error)
            reading = attrs.evolve(previous, loaded_at=started, stamp=stamp, files=files)
        else:
            keys: dict[str, tuple[bytes | None, bytes]] = {}
            for _, info in scan.accepted:
                agreement_key = info.agreement_key_bytes()
                if agreement_key is not None:  # (an accepted node-info always has one)
                    keys[info.name] = (_hex_or_none(info.public_key), agreement_key)
            refusals = {path.stem: reason for path, reason in scan.rejected}
            reading = _MapReading(
                keys=keys, refusals=refusals, loaded_at=started, stamp=stamp, files=files
            )
        self._reading = reading
        return reading


@attrs.frozen
class _MapReading:
    """One complete reading of the network map by :class:`NetworkMapPeerKeys`."""

    keys: dict[str, tuple[bytes | None, bytes]]
    """By node name: its Ed25519 public key (None if absent or not hex), its agreement key."""
    refusals: dict[str, str]
    """By node key (the file's stem): why its node-info was refused."""
    loaded_at: float
    """``time.monotonic()`` when the reading began."""
    stamp: int | None
    """The map directory's modification time when the reading began (publishing changes it)."""
    files: dict[str, tuple[int, int]]
    """Each node-info file's (inode, modification time) when the reading began, by node key."""


def _hex_or_none(text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None
