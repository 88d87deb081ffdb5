"""The snapshot restricted to the candidate conversations of the screening.

:mod:`persistence.analytics.screening` leaves to the checks the conversations it cannot call
healthy. They judge those with their full rules, on a :class:`Snapshot` that holds, of the big
tables, only the rows that concern them (cached: they are few):

* ``message_ids`` and ``outbox``: the rows of the candidate conversations (every row of each,
  so a session's sequence numbers are whole), and the outbox rows whose id is not of the
  grammar (no conversation; the audit still judges their age);
* ``checkpoints``: the flows waiting on a candidate conversation, with ``waits`` cut to the
  candidate sessions (so no healthy session end is counted twice), and every flow a rule may
  look up for a candidate end (the initiating flow, the responder, the counterpart), with
  ``waits`` cut the same way;
* ``results``, ``exceptions``, ``blobs``: the rows of those flows (and the flows whose
  facts alone show a candidate conversation), the ``facts`` of every flow row cut to the
  candidate sessions as ``waits`` are;
* ``paused`` and ``workers`` whole (small).

Rules that need every row (the latest record per node and sender, a message id reused in
another conversation) read :attr:`Snapshot.whole`, the snapshot it was cut from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.check_results import CheckSettings, as_of_ms
from persistence.analytics.flow_facts import FACT_FRAMES, FACTS, FACTS_TEXT, fact_keys
from persistence.analytics.screening import screen
from persistence.analytics.session_columns import (
    conversation_key,
    counterpart_flow,
    initiator_session,
    is_responder,
    message_session,
    responder_flow_id,
    session_flow,
)
from persistence.analytics.session_flows import FLOW_KEY, flow_keys
from persistence.analytics.waiting import RECEIVE, STUCK_COLUMNS, WAITS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot

CHECKPOINT_COLUMNS_LEFT = (
    "waiting_for",
    FACTS_TEXT,
    "progress_step",
    "error_message",
    "journal_length",
    "checkpoint_bytes",
    "created_at",
    *STUCK_COLUMNS,
)
"""Columns of a checkpoint row the candidates' rules never read (not copied; the stuck
check's would no longer match ``waits`` once cut to the candidate sessions)."""
BROADCAST_ROWS = 200_000
"""Up to this many candidate conversations (and flows), the big tables are filtered through a
broadcast (a scan, no shuffle); more use plain joins."""


def candidate_snapshot(snapshot: Snapshot, settings: CheckSettings) -> Snapshot:
    """``snapshot`` restricted to the screening's candidates (built once, cached).

    ``snapshot`` itself when it was not screened (too small to be worth it).
    """
    old_before = as_of_ms(snapshot, settings) - settings.outbox_after_ms
    return snapshot.shared_value(
        ("candidates", old_before), lambda: _restricted(snapshot, settings)
    )


def _narrow(frame: DataFrame, rows: int) -> DataFrame:
    from pyspark.sql import functions as F

    return F.broadcast(frame) if rows <= BROADCAST_ROWS else frame


def _restricted(snapshot: Snapshot, settings: CheckSettings) -> Snapshot:
    from pyspark.sql import functions as F

    from persistence.analytics.snapshot import Snapshot

    found = screen(snapshot, settings)
    if found.candidates is None:  # not screened: the rules judge the whole snapshot
        return snapshot
    wanted = _narrow(
        found.candidates.select(F.col("conversation").alias("c_key")), found.candidate_count
    )

    def kept(frame: DataFrame) -> DataFrame:
        # checkpointed, not only cached: the rules build long plans on these frames, and
        # every plan would print a cached frame's whole plan each time it names the frame
        return frame.localCheckpoint(eager=True)

    def of_candidates(frame: DataFrame, key: Column) -> DataFrame:
        return frame.join(wanted, key == F.col("c_key"), "left_semi")

    ids = kept(of_candidates(snapshot.message_ids, conversation_key(F.col("session_id"))))
    outbox_session = message_session(F.col("message_id"))
    outbox = kept(
        of_candidates(
            snapshot.outbox.where(outbox_session != ""), conversation_key(outbox_session)
        ).unionByName(snapshot.outbox.where(outbox_session == ""))
    )
    exploded = snapshot.checkpoints.where(F.col("suspended_on") == RECEIVE).select(
        "node", "flow_id", F.posexplode(WAITS).alias("pos", "w")
    )
    waited = kept(of_candidates(exploded, conversation_key(F.col("w.session"))))

    def facts(frame: DataFrame) -> DataFrame:
        """(node, flow_id, pos, f): each session of the rows' facts in a candidate."""
        exploded = frame.select("node", "flow_id", F.posexplode(FACTS).alias("pos", "f"))
        return of_candidates(exploded, fact_keys(F.col("f"))[0])

    looked_up = _flows_looked_up(ids, outbox, waited)
    if found.facts_only:  # conversations only facts show: their flows found by their facts
        for name in FACT_FRAMES:
            shown = facts(snapshot.frames[name])
            looked_up = looked_up.unionByName(
                shown.select(F.col("node").alias("k_node"), F.col("flow_id").alias("k_flow"))
            )
    flows = kept(
        looked_up.select(
            "k_node", "k_flow", F.xxhash64("k_node", "k_flow").alias("k_key")
        ).distinct()
    )
    few = _narrow(flows, flows.count())
    named = {"node": F.col("k_node"), "flow_id": F.col("k_flow")}

    def of_flows(frame: DataFrame) -> DataFrame:
        # by the flow key, the node and flow id taken from the flows asked for (the same
        # 2**-64 chance of a colliding key as the screening's)
        others = [name for name in frame.columns if name not in (*named, FLOW_KEY)]
        keyed = flow_keys(frame, *others)
        return keyed.join(few, F.col(FLOW_KEY) == F.col("k_key")).select(
            *[named[name].alias(name) if name in named else F.col(name) for name in frame.columns]
        )

    cut = waited.groupBy(F.col("node").alias("c_node"), F.col("flow_id").alias("c_flow")).agg(
        F.transform(
            F.sort_array(F.collect_list(F.struct("pos", "w"))), lambda entry: entry["w"]
        ).alias("c_waits")
    )
    # only what the rules read of a checkpoint (its JSON text, error and sizes stay behind)
    wanted_columns = [
        name for name in snapshot.checkpoints.columns if name not in CHECKPOINT_COLUMNS_LEFT
    ]
    checkpoints = of_flows(snapshot.checkpoints.select(*wanted_columns))
    checkpoints = checkpoints.join(
        cut, (checkpoints.node == cut.c_node) & (checkpoints.flow_id == cut.c_flow), "left"
    )
    checkpoints = checkpoints.withColumn(WAITS, F.col("c_waits")).drop(
        "c_node", "c_flow", "c_waits"
    )

    def cut_facts(frame: DataFrame) -> DataFrame:
        """``frame`` with its ``facts`` cut to the candidate sessions (null stays null)."""
        cut = (
            facts(frame)
            .groupBy(F.col("node").alias("x_node"), F.col("flow_id").alias("x_flow"))
            .agg(
                F.transform(
                    F.sort_array(F.collect_list(F.struct("pos", "f"))), lambda entry: entry["f"]
                ).alias("x_facts")
            )
        )
        none = F.filter(F.col(FACTS), lambda _: F.lit(False))  # [] of the type, or null
        joined = frame.join(cut, (frame.node == cut.x_node) & (frame.flow_id == cut.x_flow), "left")
        return joined.withColumn(FACTS, F.coalesce(F.col("x_facts"), none)).drop(
            "x_node", "x_flow", "x_facts"
        )

    frames = dict(snapshot.frames)
    frames.update(
        checkpoints=kept(cut_facts(checkpoints)),
        message_ids=ids,
        outbox=outbox,
        results=kept(cut_facts(of_flows(snapshot.results))),
        exceptions=kept(cut_facts(of_flows(snapshot.exceptions))),
        blobs=kept(of_flows(snapshot.blobs)),
    )
    return Snapshot(spark=snapshot.spark, nodes=snapshot.nodes, frames=frames, parent=snapshot)


def _flows_looked_up(ids: DataFrame, outbox: DataFrame, waited: DataFrame) -> DataFrame:
    """(``k_node``, ``k_flow``): every flow a rule may look up for a candidate's rows.

    The waiting flows themselves, and for each end: the flow that holds it on its node
    (its own flow for an initiator end, the responder for a responder end, by the sender)
    and the counterpart on the other node.
    """
    from pyspark.sql import functions as F

    ends = (
        ids.select("node", F.col("session_id").alias("session"), F.col("sender").alias("peer"))
        .unionByName(
            outbox.select(
                "node",
                message_session(F.col("message_id")).alias("session"),
                F.col("target").alias("peer"),
            )
        )
        .unionByName(
            waited.select(
                "node", F.col("w.session").alias("session"), F.col("w.counterparty").alias("peer")
            )
        )
        .distinct()
    )
    session, node, peer = F.col("session"), F.col("node"), F.col("peer")
    owner = F.when(
        is_responder(session), responder_flow_id(peer, initiator_session(session))
    ).otherwise(session_flow(session))
    keys = ends.select(
        F.explode(
            F.array(
                F.struct(node.alias("k_node"), owner.alias("k_flow")),
                F.struct(node.alias("k_node"), session_flow(session).alias("k_flow")),
                F.struct(peer.alias("k_node"), counterpart_flow(node, session).alias("k_flow")),
            )
        ).alias("k")
    ).select("k.*")
    waiting = waited.select(F.col("node").alias("k_node"), F.col("flow_id").alias("k_flow"))
    return keys.unionByName(waiting).where(
        F.col("k_node").isNotNull() & F.col("k_flow").isNotNull()
    )
