"""``fiberflow analyze --key-file`` and ``--node-config``: the nodes' checkpoint keys.

A node's checkpoint MAC key is derived from its Ed25519 private key, the PEM file its node
config names as ``key_file`` (default ``<node key>.key.pem`` beside the config; see
docs/security.md). ``fiberflow analyze`` accepts that same file:

* ``--key-file 'O=Alice,L=London,C=GB=/etc/fiberflow/alice.key.pem'``: the node's name,
  ``=``, the path (the name ends at the first ``=`` where what comes before is a whole
  X.500 name, so the name keeps its own ``=`` signs);
* ``--node-config alice.toml``: the node config itself, which gives the node's name, its
  database (added as a ``--node``) and its key file.

The file must be readable by its owner only, as the node requires; it is never created.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from flows.network.identity import KeyFileError, load_identity
from flows.party import Party
from persistence.analytics.sources import KeyArgumentError


@attrs.frozen
class NodeKey:
    """A node's name and the key file its checkpoint MAC key comes from."""

    name: str
    path: Path

    def mac_key(self) -> bytes:
        """The checkpoint MAC key, as the node derives it (the file is never created)."""
        try:
            return load_identity(self.path, self.name).mac_key()
        except KeyFileError as error:
            raise KeyArgumentError(f"checkpoint key of {self.name}: {error}") from error


def parse_key_argument(text: str) -> NodeKey:
    """``NAME=PATH`` (an X.500 name, then the key file) as a :class:`NodeKey`."""
    for index, character in enumerate(text):
        if character != "=":
            continue
        name, path = text[:index].strip(), text[index + 1 :].strip()
        try:
            Party(name)
        except (TypeError, ValueError):
            continue
        if path:
            return NodeKey(name, Path(path))
    raise KeyArgumentError(
        f"--key-file {text!r} must be NODE=PATH, a node's X.500 name and its key file, "
        "e.g. 'O=Alice,L=London,C=GB=alice.key.pem'"
    )


def node_config_argument(path: str | Path) -> tuple[str, NodeKey]:
    """A node config's ``--node`` argument (``NAME=URL``) and its key file."""
    from flows.config.runtime import ConfigError, load_config

    try:
        config = load_config(path)
    except ConfigError as error:
        raise KeyArgumentError(f"--node-config {path}: {error}") from error
    if config.key_file is None:
        raise KeyArgumentError(f"--node-config {path}: the config names no key_file")
    url = config.database_url
    if config.database_schema is not None:
        url += ("&" if "?" in url else "?") + f"schema={config.database_schema}"
    return f"{config.name}={url}", NodeKey(config.name, config.key_file)


def load_keys(keys: list[NodeKey]) -> dict[str, bytes]:
    """Each node's checkpoint MAC key by name (before Spark starts: a bad file fails fast)."""
    found: dict[str, bytes] = {}
    for key in keys:
        if key.name in found:
            raise KeyArgumentError(f"two key files for {key.name}")
        found[key.name] = key.mac_key()
    return found
