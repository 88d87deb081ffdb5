"""Naming the databases given as plain URLs, from what the other nodes' tables say.

A node's own name is not stored in its tables; the other nodes' tables hold it, as the
counterparty of each session end they show. :func:`infer_node_names` finds it there and
:func:`apply_names` puts it in place of the stand-in (the URL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from persistence.analytics.evidence import waits
from persistence.analytics.session_columns import (
    is_responder,
    message_session,
    peer_session,
    session_flow,
)
from persistence.analytics.snapshot import NodeLoad
from persistence.analytics.sources import NodeSource
from persistence.analytics.tables import AnalyticsLoadError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def infer_node_names(
    frames: dict[str, DataFrame], sources: Sequence[NodeSource]
) -> dict[str, str | None]:
    """The node name of each database given as a plain URL, found in the others' tables.

    Another node's tables name their counterparty with each session end they show (a
    consumed message's ``sender``, an outbox row's ``target``, a waited-on session's
    ``counterparty``). The other end of that session (``X`` <-> ``X.r``) belongs to the
    database that shows it too (consumed, queued or waited on there), or, for an initiator
    end ``F.sN``, whose flows include ``F``. Every such pair names the database; a database
    named two ways is an error (the same database given twice?), one named by nobody keeps
    its URL as the name (None here): its sessions cannot then be matched across nodes.

    ``frames`` are the loaded frames with the stand-in names (the URLs) in ``node``.
    """
    from pyspark.sql import functions as F

    outbox_session = message_session(F.col("message_id"))
    ends = (
        frames["message_ids"]
        .select("node", "session_id", F.col("sender").alias("counterparty"))
        .unionByName(
            frames["outbox"].select(
                "node", outbox_session.alias("session_id"), F.col("target").alias("counterparty")
            )
        )
        .unionByName(waits(frames["checkpoints"]).select("node", "session_id", "counterparty"))
        .where(F.col("session_id") != "")
        .distinct()
    )
    flows = (
        frames["checkpoints"]
        .select("node", "flow_id")
        .unionByName(frames["results"].select("node", "flow_id"))
        .unionByName(frames["exceptions"].select("node", "flow_id"))
        .distinct()
    )
    theirs = ends.select(
        F.col("node").alias("seen_on"),
        F.col("counterparty").alias("name"),
        peer_session(F.col("session_id")).alias("end"),
    )
    own_ends = ends.select(F.col("node").alias("database"), F.col("session_id").alias("end"))
    by_end = theirs.join(own_ends, "end")
    own_flows = flows.select(F.col("node").alias("database"), F.col("flow_id").alias("flow"))
    by_flow = theirs.where(~is_responder(F.col("end"))).join(
        own_flows, session_flow(theirs["end"]) == own_flows["flow"]
    )
    pairs = (
        by_end.select("seen_on", "name", "database")
        .unionByName(by_flow.select("seen_on", "name", "database"))
        .where(F.col("seen_on") != F.col("database"))
        .select("database", "name")
        .distinct()
    )
    stand_ins = [source.name for source in sources if not source.named]
    found: dict[str, set[str]] = {}
    for row in pairs.where(F.col("database").isin(*stand_ins)).collect():
        found.setdefault(row["database"], set()).add(row["name"])
    given = {source.name for source in sources if source.named}
    names: dict[str, str | None] = {}
    for stand_in in stand_ins:
        candidates = sorted(found.get(stand_in, ()))
        if len(candidates) > 1:
            raise AnalyticsLoadError(
                f"{stand_in}: the other nodes' tables name it {' and '.join(candidates)}; "
                "give it as NAME=URL"
            )
        name = candidates[0] if candidates else None
        if name is not None and (name in given or name in names.values()):
            raise AnalyticsLoadError(f"{stand_in} is node {name}, which is given twice")
        names[stand_in] = name
    return names


def apply_names(
    frames: dict[str, DataFrame], loads: dict[str, NodeLoad], names: dict[str, str | None]
) -> tuple[dict[str, DataFrame], dict[str, NodeLoad]]:
    """Put the found names in place of the stand-ins (in ``node`` and in the loads)."""
    from pyspark.sql import functions as F

    renamed: dict[str, NodeLoad] = {}
    for key, load in loads.items():
        if key not in names:
            renamed[key] = load
            continue
        name = names[key]
        if name is None:
            renamed[key] = attrs.evolve(load, named_by="unknown")
        else:
            renamed[key] = attrs.evolve(load, name=name, named_by="other nodes")
    mapping = {key: name for key, name in names.items() if name is not None}
    if not mapping:
        return frames, renamed
    node = F.col("node")
    column = node
    for stand_in, name in mapping.items():
        column = F.when(node == stand_in, F.lit(name)).otherwise(column)
    return {key: frame.withColumn("node", column) for key, frame in frames.items()}, renamed
