"""The network map: which nodes exist, their keys and addresses.

The map is a directory of node-info files, one JSON file per node named
``<node key>.json``, like Corda's ``additional-node-infos``. A node writes its own file when
it starts (atomically: a temporary file renamed into place) and reads the others' to know
its peers. Share the directory between the nodes of a host, or copy the files to each host.

A node-info file::

    {"name": "O=Bob,L=New York,C=US", "node_key": "3f...", "address": "O=Bob,L=New York,C=US",
     "transport": "sqlite:///.../queue.db", "public_key": "9c1f...",
     "agreement_key": "5a07...", "platform_version": 1,
     "updated_at": "2026-11-22T19:30:00+00:00"}

``node_key`` is the first 32 hex digits of the SHA-256 of the name (the AMQP transport names
queues after it); ``public_key`` is the hex of the node's Ed25519 identity key (its
certificate certifies it, and it signs the node-info); ``agreement_key`` is the hex of the
node's X25519 agreement key (:mod:`messaging.pair_keys`), from which every peer computes the
key that authenticates the messages between them.

A node-info without a usable ``agreement_key`` (an older fiberflow's, which signed every
message with its Ed25519 key instead) is **refused**, with a reason naming the field: nobody
could authenticate messages to or from that node, so it is listed with the refused files
(:meth:`NetworkMap.rejected`, ``fiberflow network verify``, ``fiberflow node outbox``), its
messages are dead-lettered as from an unknown sender and messages for it wait in the outbox
until it publishes one (it does at its next start with this version).

On a network with a trust root (:mod:`flows.network.trust`) a node-info also carries
``certificate`` (the PEM of the node's certificate, issued by the root) and ``signature``
(hex: the node's Ed25519 signature of :meth:`NodeInfo.signed_bytes`, every other field). A
:class:`NetworkMap` given the root returns only the node-infos that verify, and lists the
others with their reasons (:meth:`NetworkMap.rejected`). Files without these two fields
(networks without a root) still read.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import attrs

from flows.party import Party
from messaging.pair_keys import AGREEMENT_KEY_BYTES


class NodeInfoSigner(Protocol):
    """What signs a node-info (a node's :class:`~flows.network.identity.NodeIdentity`)."""

    name: str

    @property
    def public_key_hex(self) -> str:
        """The node's public key, as hex."""

    @property
    def agreement_key_hex(self) -> str:
        """The node's X25519 agreement key, as hex."""

    def sign_bytes(self, data: bytes) -> bytes:
        """The node's signature of ``data``."""


class NodeInfoVerifier(Protocol):
    """What checks a node-info: the network root (:class:`~flows.network.trust.NetworkRoot`)."""

    def verify_node_info(self, info: NodeInfo) -> None:
        """Return if ``info`` is certified and signed; raise :class:`NodeInfoRejected` if not."""


log = logging.getLogger("fiberflow.network_map")

_logged: dict[Path, str] = {}
"""Each refused file logged in this process, with the digest of the content logged."""
_logged_lock = threading.Lock()

PLATFORM_VERSION = 1
"""The messaging and checkpoint protocol version this fiberflow speaks."""
NODE_INFO_SIGNATURE_CONTEXT = b"fiberflow-node-info-v1\n"
"""Domain separation: what a node-info signature covers starts with this line."""


class NetworkMapError(ValueError):
    """A node-info file that cannot be read; the message names the file and the problem."""


class NodeInfoRejected(ValueError):
    """A node-info the network's trust root refuses; the message is one line saying why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        """Why the node-info is refused (one line)."""


def node_key(name: str) -> str:
    """A node's key: the first 32 hex digits of the SHA-256 of its name."""
    return hashlib.sha256(name.encode()).hexdigest()[:32]


@attrs.frozen
class NodeInfo:
    """One node's entry in the network map."""

    name: str
    address: str
    transport: str
    public_key: str | None = None
    """Hex of the node's Ed25519 identity key."""
    agreement_key: str | None = None
    """Hex of the node's X25519 agreement key (None: an older node's; refused)."""
    platform_version: int = PLATFORM_VERSION
    updated_at: str = ""
    certificate: str | None = None
    """The PEM of the node's certificate, issued by the network root (None: no root)."""
    signature: str | None = None
    """Hex of the node's Ed25519 signature of :meth:`signed_bytes` (None: unsigned)."""

    @property
    def node_key(self) -> str:
        """See :func:`node_key`."""
        return node_key(self.name)

    def agreement_problem(self) -> str | None:
        """Why the node-info's ``agreement_key`` cannot be used, or None if it can."""
        if self.agreement_key is None:
            return (
                "no agreement_key: the node-info was published by a fiberflow that signed "
                "messages with Ed25519; messages to and from the node cannot be authenticated "
                "until it publishes one (it does when it starts with this version)"
            )
        if self.agreement_key_bytes() is None:
            return f"agreement_key is not {AGREEMENT_KEY_BYTES} bytes of hex"
        return None

    def agreement_key_bytes(self) -> bytes | None:
        """The raw agreement key, or None if there is none or it is not 32 bytes of hex."""
        if self.agreement_key is None:
            return None
        try:
            raw = bytes.fromhex(self.agreement_key)
        except ValueError:
            return None
        return raw if len(raw) == AGREEMENT_KEY_BYTES else None

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in the file (an unset key, certificate or signature left out)."""
        document = attrs.asdict(self)
        for field in ("agreement_key", "certificate", "signature"):
            if document[field] is None:
                del document[field]
        document["node_key"] = self.node_key
        return document

    def signed_bytes(self) -> bytes:
        """What the node's signature covers: the canonical JSON of every field but the signature.

        Sorted keys, no spaces, after :data:`NODE_INFO_SIGNATURE_CONTEXT`.
        """
        document = self.to_json()
        document.pop("signature", None)
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
        return NODE_INFO_SIGNATURE_CONTEXT + canonical.encode()

    def signed_by(self, identity: NodeInfoSigner) -> NodeInfo:
        """The node-info signed with ``identity``'s key (which must be its own).

        Its ``public_key`` and ``agreement_key`` are set to ``identity``'s (if given, they must
        be those already), so the signature covers both.
        """
        if identity.name != self.name:
            raise ValueError(f"node-info of {self.name} cannot be signed by {identity.name}")
        if self.public_key not in (None, identity.public_key_hex):
            raise ValueError(f"node-info of {self.name} names another public key than its signer's")
        if self.agreement_key not in (None, identity.agreement_key_hex):
            raise ValueError(
                f"node-info of {self.name} names another agreement key than its signer's"
            )
        unsigned = attrs.evolve(
            self,
            public_key=identity.public_key_hex,
            agreement_key=identity.agreement_key_hex,
            signature=None,
        )
        signature = identity.sign_bytes(unsigned.signed_bytes())
        return attrs.evolve(unsigned, signature=signature.hex())


@attrs.frozen
class NetworkMapScan:
    """One reading of the network map directory: the files accepted and the files refused."""

    accepted: tuple[tuple[Path, NodeInfo], ...]
    """Each accepted file with its node-info, in file name order."""
    rejected: tuple[tuple[Path, str], ...]
    """Each refused file with the reason (one line), in file name order."""


class NetworkMap:
    """The node-info files of one directory.

    Without a ``root`` every readable node-info is taken as it is (and an unreadable file
    raises :class:`NetworkMapError`). With a ``root`` (a
    :class:`~flows.network.trust.NetworkRoot`) only node-infos with a certificate issued by
    it and a valid signature by the node itself are returned. In either case a node-info
    without a usable ``agreement_key`` is refused (:meth:`NodeInfo.agreement_problem`). A
    refused file is listed by :meth:`rejected`, logged at WARNING once per process and
    content of the file, and never stops the others loading.
    """

    def __init__(self, directory: str | Path, root: NodeInfoVerifier | None = None) -> None:
        self.directory = Path(directory)
        self.root = root
        """The network's trust root, or None (every node-info is taken as it is)."""

    def publish(self, info: NodeInfo, identity: NodeInfoSigner | None = None) -> Path:
        """Write (or replace) ``info``'s file, signed by ``identity`` if given; returns its path.

        The file is stamped with the time (``updated_at``) before it is signed, so the stamp
        is covered by the signature.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        stamped = attrs.evolve(info, updated_at=_now(), signature=None)
        if identity is not None:
            stamped = stamped.signed_by(identity)
        path = self.directory / f"{info.node_key}.json"
        # A draft of its own (threads of one process may publish at once), renamed over the
        # file: a reader sees the old file or the new one, never half of one.
        temporary = path.with_suffix(f".{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            temporary.write_text(json.dumps(stamped.to_json(), indent=2) + "\n")
            temporary.replace(path)
        finally:
            temporary.unlink(missing_ok=True)
        return path

    def nodes(self) -> dict[str, NodeInfo]:
        """Every node in the map, by name (with a root: every node whose node-info verifies)."""
        if self.root is None:
            found: dict[str, NodeInfo] = {}
            refused: list[tuple[Path, str]] = []
            for path in self._files():
                info = _read(path)
                problem = info.agreement_problem()
                if problem is None:
                    found[info.name] = info
                else:
                    refused.append((path, f"{info.name}: {problem}"))
            self._log_rejected(refused)
            return found
        scan = self.scan()
        self._log_rejected(scan.rejected)
        return {info.name: info for _, info in scan.accepted}

    def lookup(self, name: str) -> NodeInfo | None:
        """The entry of ``name``, or None (with a root: also None if it does not verify)."""
        path = self.directory / f"{node_key(name)}.json"
        if not path.is_file():
            return None
        if self.root is None:
            found = _read(path)
            problem = found.agreement_problem()
            if problem is None:
                return found
            self._log_rejected([(path, f"{found.name}: {problem}")])
            return None
        info, reason = self._check(path)
        if reason is not None:
            self._log_rejected([(path, reason)])
        return info

    def rejected(self) -> list[tuple[Path, str]]:
        """The files refused now, with their reasons (without a root: the unreadable ones)."""
        return list(self.scan().rejected)

    def scan(self) -> NetworkMapScan:
        """Read (and, with a root, verify) every node-info file, without logging."""
        accepted: list[tuple[Path, NodeInfo]] = []
        rejected: list[tuple[Path, str]] = []
        for path in self._files():
            info, reason = self._check(path)
            if info is not None:
                accepted.append((path, info))
            else:
                assert reason is not None
                rejected.append((path, reason))
        return NetworkMapScan(tuple(accepted), tuple(rejected))

    def _files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("*.json"))

    def _check(self, path: Path) -> tuple[NodeInfo | None, str | None]:
        """``path``'s node-info if it is accepted, else the reason it is refused."""
        try:
            info = _read(path)
        except NetworkMapError as error:
            return None, str(error).removeprefix(f"network map file {path}: ")
        if self.root is not None:
            try:
                self.root.verify_node_info(info)
            except NodeInfoRejected as error:
                return None, f"{info.name}: {error.reason}"
        problem = info.agreement_problem()
        if problem is not None:
            return None, f"{info.name}: {problem}"
        return info, None

    def _log_rejected(self, rejected: Iterable[tuple[Path, str]]) -> None:
        """Log each refusal once per process and content of its file (logged again if changed)."""
        for path, reason in rejected:
            try:
                content = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                content = reason
            with _logged_lock:
                if _logged.get(path.resolve()) == content:
                    continue
                _logged[path.resolve()] = content
            log.warning("network map file %s refused: %s", path, reason)


def _read(path: Path) -> NodeInfo:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as error:  # (nested too deep: RecursionError)
        raise NetworkMapError(f"network map file {path}: {error}") from error
    if not isinstance(document, dict):
        raise NetworkMapError(f"network map file {path}: not a JSON object")
    try:
        Party(document["name"])
        info = NodeInfo(
            name=document["name"],
            address=document["address"],
            transport=document["transport"],
            public_key=document.get("public_key"),
            agreement_key=_optional_text(document, "agreement_key"),
            platform_version=int(document.get("platform_version", PLATFORM_VERSION)),
            updated_at=str(document.get("updated_at", "")),
            certificate=_optional_text(document, "certificate"),
            signature=_optional_text(document, "signature"),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise NetworkMapError(f"network map file {path}: bad or missing field {error}") from error
    if path.stem != info.node_key:
        raise NetworkMapError(f"network map file {path}: named for another node than {info.name}")
    return info


def _optional_text(document: dict[str, Any], field: str) -> str | None:
    value = document.get(field)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{field!r} must be a string, not {type(value).__name__}")
    return value


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
