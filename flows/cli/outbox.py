"""``fiberflow outbox list|drop``: the messages a node has not handed to a peer yet.

A row stays in ``node_outbox`` until its peer's transport took it. Rows for a peer that is
reachable leave by themselves; rows for a party that is not on the network map (it left, was
never there, or its node-info is refused) wait for it to come (back). ``list`` shows every
row with its peer, age, the flow that sent it and what the network map says of the peer;
``drop`` deletes the rows of one peer that is not on the map. The running node's relay
stops trying a dropped row the next time it would have (it asks
:meth:`flows.node.node.Node.abandoned_reason`), and the rows of a flow that has ended are given
up by the node itself, so ``drop`` is for the rows of live flows whose peer will not come
back: kill those flows too (``fiberflow flow kill``), or they wait for an answer.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from sqlalchemy import delete, select

from flows.cli.peer import peer_verdicts
from flows.config.runtime import RuntimeConfig
from persistence import schema
from persistence.store import NodeDatabase
from statemachine.partitions import sending_flow_of_message

DEFAULT_LIMIT = 50
"""Rows ``outbox list`` prints one by one unless told otherwise (all are counted)."""


def outbox_rows(config: RuntimeConfig, database: NodeDatabase) -> list[dict[str, Any]]:
    """Every outbox row (oldest first): id, peer, age, sending flow, whether it lives, map."""
    table = schema.node_outbox
    query = select(table.c.message_id, table.c.target, table.c.created_at).order_by(
        table.c.created_at, table.c.message_id
    )
    with database.engine.connect() as connection:
        rows = list(connection.execute(query))
        senders = {r.message_id: sending_flow_of_message(r.message_id, r.target) for r in rows}
        flow_ids = sorted({f for f in senders.values() if f is not None})
        live: set[str] = set()
        checkpoints = schema.node_checkpoints
        for start in range(0, len(flow_ids), 500):
            chunk = flow_ids[start : start + 500]
            found = select(checkpoints.c.flow_id).where(checkpoints.c.flow_id.in_(chunk))
            live.update(connection.execute(found).scalars())
    verdicts = peer_verdicts(config, {r.target for r in rows})
    now = time.time()
    return [
        {
            "message_id": r.message_id,
            "peer": r.target,
            "age_seconds": round(max(0.0, now - r.created_at / 1000), 1),
            "flow_id": senders[r.message_id],
            "flow_live": senders[r.message_id] in live,
            "on_network_map": verdicts[r.target].on_map,
            "network_map": verdicts[r.target].text,
        }
        for r in rows
    ]


def print_outbox_rows(
    config: RuntimeConfig, database: NodeDatabase, as_json: bool, limit: int
) -> int:
    """``fiberflow outbox list``: a line per peer, then the rows (up to ``limit``)."""
    rows = outbox_rows(config, database)
    if as_json:
        print(json.dumps({"node": config.name, "messages": rows}, indent=2))
        return 0
    if not rows:
        print(f"the outbox of {config.name} is empty: every message was taken by its peer")
        return 0
    by_peer: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_peer.setdefault(row["peer"], []).append(row)
    print(f"{len(rows)} message(s) in the outbox of {config.name}, for {len(by_peer)} peer(s):")
    for peer, peer_rows in sorted(by_peer.items()):
        live = sum(r["flow_live"] for r in peer_rows)
        oldest = max(r["age_seconds"] for r in peer_rows)
        print(
            f"  {peer}: {len(peer_rows)} message(s), oldest {oldest:g} s, {live} from live "
            f"flows; {peer_rows[0]['network_map']}"
        )
    print("MESSAGE ID  PEER  AGE  FLOW  FLOW STATE")
    for row in rows[:limit]:
        state = "live" if row["flow_live"] else "ended"
        print(
            f"{row['message_id']}  {row['peer']}  {row['age_seconds']:g}s  "
            f"{row['flow_id'] or '-'}  {state}"
        )
    if len(rows) > limit:
        print(f"... and {len(rows) - limit} more (--limit N, or --json for all)")
    return 0


def drop_peer_rows(config: RuntimeConfig, database: NodeDatabase, peer: str) -> int:
    """``fiberflow outbox drop --peer NAME``: delete the rows of a peer off the network map."""
    verdict = peer_verdicts(config, [peer])[peer]
    if verdict.on_map is None:
        print(
            f"fiberflow outbox drop: cannot tell whether {peer} is on the network map "
            f"({verdict.text}); nothing dropped",
            file=sys.stderr,
        )
        return 2
    if verdict.on_map:
        print(
            f"fiberflow outbox drop: {peer} is {verdict.text}: its messages go out by "
            "themselves; only those of a party off the map can be dropped",
            file=sys.stderr,
        )
        return 2
    rows = [r for r in outbox_rows(config, database) if r["peer"] == peer]
    if not rows:
        print(f"no message for {peer} in the outbox of {config.name}; nothing dropped")
        return 0
    table = schema.node_outbox
    with database.engine.begin() as connection:
        ids = [r["message_id"] for r in rows]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            connection.execute(delete(table).where(table.c.message_id.in_(chunk)))
    live = sorted({r["flow_id"] for r in rows if r["flow_live"] and r["flow_id"]})
    print(f"dropped {len(rows)} message(s) for {peer} ({verdict.text})")
    if live:
        print(
            f"{len(live)} live flow(s) sent them and may wait for an answer that cannot come: "
            + ", ".join(live)
            + " (fiberflow flow kill ID ends one)"
        )
    return 0
