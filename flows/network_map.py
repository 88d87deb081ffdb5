"""The network map: which nodes exist, their keys and addresses.

The map is a directory of node-info files, one JSON file per node named
``<node key>.json``, like Corda's ``additional-node-infos``. A node writes its own file when
it starts (atomically: a temporary file renamed into place) and reads the others' to know
its peers. Share the directory between the nodes of a host, or copy the files to each host.

A node-info file::

    {"name": "O=Bob,L=New York,C=US", "node_key": "3f...", "address": "O=Bob,L=New York,C=US",
     "transport": "sqlite:///.../queue.db", "public_key": "9c1f...", "platform_version": 1,
     "updated_at": "2026-11-22T19:30:00+00:00"}

``node_key`` is the first 32 hex digits of the SHA-256 of the name (the AMQP transport names
queues after it); ``public_key`` is the hex of the node's Ed25519 public key, against which
every message claiming to come from the node is verified.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import attrs

from flows.party import Party

PLATFORM_VERSION = 1
"""The messaging and checkpoint protocol version this fiberflow speaks."""


class NetworkMapError(ValueError):
    """A node-info file that cannot be read; the message names the file and the problem."""


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
    platform_version: int = PLATFORM_VERSION
    updated_at: str = ""

    @property
    def node_key(self) -> str:
        """See :func:`node_key`."""
        return node_key(self.name)

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in the node-info file."""
        document = attrs.asdict(self)
        document["node_key"] = self.node_key
        return document


class NetworkMap:
    """The node-info files of one directory."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def publish(self, info: NodeInfo) -> Path:
        """Write (or replace) ``info``'s file; returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        stamped = attrs.evolve(info, updated_at=_now())
        path = self.directory / f"{info.node_key}.json"
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(stamped.to_json(), indent=2) + "\n")
        temporary.replace(path)
        return path

    def nodes(self) -> dict[str, NodeInfo]:
        """Every node in the map, by name."""
        found: dict[str, NodeInfo] = {}
        if not self.directory.is_dir():
            return found
        for path in sorted(self.directory.glob("*.json")):
            info = _read(path)
            found[info.name] = info
        return found

    def lookup(self, name: str) -> NodeInfo | None:
        """The entry of ``name``, or None."""
        path = self.directory / f"{node_key(name)}.json"
        return _read(path) if path.is_file() else None


def _read(path: Path) -> NodeInfo:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
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
            platform_version=int(document.get("platform_version", PLATFORM_VERSION)),
            updated_at=str(document.get("updated_at", "")),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise NetworkMapError(f"network map file {path}: bad or missing field {error}") from error
    if path.stem != info.node_key:
        raise NetworkMapError(f"network map file {path}: named for another node than {info.name}")
    return info


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
