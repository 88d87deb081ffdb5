"""Operator commands of the peer-to-peer topology: peer accounts, and what waits for peers.

* ``fiberflow peer-account --inbound URL --node NAME --user USER``: what the operator of a
  node runs to give a peer an account on the node's own inbound: ``rabbitmqctl`` commands for
  a RabbitMQ inbound (the account may publish to ``p2p.inbound`` only), SQL for a SQL queue
  on PostgreSQL (the role may insert into the node's queue only; ``--apply`` runs it).
* ``fiberflow node outbox --config node.toml``: the node's outbox by peer: how many messages
  wait, since when, and what the network map says of the peer (its address, why its
  node-info is refused, or that it is not in the map: a peer that left).
"""

from __future__ import annotations

import secrets
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
from sqlalchemy import select

from flows.config.runtime import RuntimeConfig
from flows.network.map import NetworkMap, NetworkMapError, node_key
from persistence import schema

__all__ = ["outbox_by_peer", "print_outbox", "run_peer_account"]


def run_peer_account(inbound: str, node: str, user: str, password: str | None, apply: bool) -> int:
    """``fiberflow peer-account``: print (or, for PostgreSQL, apply) a peer account's set-up."""
    scheme = inbound.split("://", 1)[0].lower() if "://" in inbound else ""
    password = password or secrets.token_urlsafe(18)
    if scheme in ("amqp", "amqps"):
        from messaging.amqp.admin import peer_account_commands

        if apply:
            print("fiberflow peer-account: --apply is for PostgreSQL inbounds", file=sys.stderr)
            return 2
        vhost = unquote(urlsplit(inbound).path.lstrip("/")) or "/"
        print(f"# on {node}'s broker: an account for a peer, publishing to p2p.inbound only")
        for command in peer_account_commands(vhost, user, password):
            print(command)
        print(f'# give the peer: [bridge_credentials."{node}"] user = "{user}", password')
        return 0
    if scheme.startswith("postgres"):
        from messaging.sqlqueue.peer_roles import apply_statements, peer_role_statements

        statements = peer_role_statements(user, password, node)
        if apply:
            apply_statements(inbound, statements)
            print(f"created role {user} on {_without_credentials(inbound)}: it may insert into")
            print(f"{node}'s queue only; its password: {password}")
            return 0
        print(f"-- on {node}'s queue database, as the owner of its tables:")
        for statement in statements:
            print(statement + ";")
        return 0
    print(
        f"fiberflow peer-account: {inbound!r}: peer accounts are for amqp://, amqps:// and "
        "postgresql:// inbounds (a SQLite queue file is protected by file permissions)",
        file=sys.stderr,
    )
    return 2


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]).geturl()


def outbox_by_peer(config: RuntimeConfig, database: Any) -> list[dict[str, Any]]:
    """The node's outbox rows grouped by peer, with what the network map says of each."""
    table = schema.node_outbox
    waiting: dict[str, list[int]] = defaultdict(list)
    with database.engine.connect() as connection:
        for target, created_at in connection.execute(select(table.c.target, table.c.created_at)):
            waiting[target].append(int(created_at))
    verdicts = peer_verdicts(config, waiting)
    now = time.time() * 1000
    return [
        {
            "peer": peer,
            "messages": len(times),
            "oldest_seconds": round((now - min(times)) / 1000, 1),
            "network_map": verdicts[peer].text,
            "on_network_map": verdicts[peer].on_map,
        }
        for peer, times in sorted(waiting.items())
    ]


@attrs.frozen
class PeerVerdict:
    """What the node's network map says of a peer."""

    on_map: bool | None
    """True: its node-info is accepted; False: absent or refused; None: no map to ask."""
    text: str
    """The verdict in words (where it is, or why it is not there)."""


def peer_verdicts(config: RuntimeConfig, peers: Iterable[str]) -> dict[str, PeerVerdict]:
    """What the node's network map (as its config names it) says of each of ``peers``."""
    peers = list(peers)
    directory = config.network_map or Path("network-map")  # the node process's default
    if not directory.is_dir():
        return {peer: PeerVerdict(None, f"no network map at {directory}") for peer in peers}
    root = _root(config)
    try:
        scan = NetworkMap(directory, root).scan()
    except NetworkMapError as error:
        return {peer: PeerVerdict(None, f"network map unreadable: {error}") for peer in peers}
    accepted = {info.name: info.transport for _, info in scan.accepted}
    refused = {path.stem: reason for path, reason in scan.rejected}
    verdicts = {}
    for peer in peers:
        if peer in accepted:
            verdicts[peer] = PeerVerdict(True, f"in the network map at {accepted[peer]}")
        elif node_key(peer) in refused:
            verdicts[peer] = PeerVerdict(False, f"node-info refused: {refused[node_key(peer)]}")
        else:
            verdicts[peer] = PeerVerdict(False, "not in the network map (left, or never joined)")
    return verdicts


def _root(config: RuntimeConfig) -> Any:
    if config.network_root is None:
        return None
    from flows.network.trust import NetworkRoot

    return NetworkRoot.load(config.network_root)


def print_outbox(config: RuntimeConfig, database: Any) -> int:
    """``fiberflow node outbox``: one line per peer with waiting messages."""
    rows = outbox_by_peer(config, database)
    if not rows:
        print("the outbox is empty: every message was confirmed by its peer's transport")
        return 0
    for row in rows:
        print(
            f"{row['peer']}: {row['messages']} message(s), oldest {row['oldest_seconds']} s; "
            f"{row['network_map']}"
        )
    return 0
