"""The ``checkpoint_blobs`` check (``fail``): facts only the checkpoint blob holds.

Run for the nodes whose checkpoint key was given (``--key-file NODE=PATH``, or the key file
a ``--node-config`` names). Their blobs are opened with the key
(:mod:`persistence.analytics.blob_facts`), and Spark joins the small facts with the dedup
ids of every analyzed node. Findings, one row each, by ``kind``:

* ``mac_mismatch``, ``stale_checkpoint``, ``undecodable_checkpoint``,
  ``foreign_checkpoint``: a blob the node would refuse to load (the reason is the node's own),
  and ``stale_checkpoint`` too for a checkpoint behind the dedup ids its own node recorded
  on its sessions (an older blob and row put back together, which the MAC cannot see);
* ``consumed_unsent``: a node recorded message ``k`` of a session whose sender's live
  checkpoint says it sent fewer than ``k + 1`` messages on it (judged for records older
  than ``grace_ms``, as the other cross-node rules: two snapshots may straddle a send);
* ``missing_last_dedup_id``: a live checkpoint took in message ``k`` of a session (it counts
  it in ``next_receive_sequence``, or holds it as an early message) and its node has no dedup
  id for it, above the last one it has. The dedup id is written in the transaction that
  takes the message in, so this is a broken promise: a redelivery of ``k`` would be taken
  in again. (A missing id *below* a recorded one is the audit's ``sequence_gap``.)
* ``responder_lost``: a live initiating flow took in its peer's confirmation of a session
  (the first message a responder sends as it starts; a refusal is never one), more than
  ``grace_ms`` ago by its own dedup id, and the peer, analyzed, holds no responder flow for
  the session, live or finished: the responder's rows were lost. From the tables alone a
  flow that took one message in and went on looks the same as one that caught a refusal
  (session consistency's ``refused or lost``); the blob tells them apart.

Without a key for a node, its blobs are not read, and the verdict says "not checked: no key".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.blob_facts import read_blob_facts
from persistence.analytics.check_results import (
    FAIL,
    INFO,
    OK,
    CheckResult,
    CheckSettings,
    FirstRows,
    Verdict,
    as_of_ms,
    count_with_first_rows,
    keep,
    keep_in_order,
)
from persistence.analytics.evidence import known_flows
from persistence.analytics.session_columns import (
    counterpart_flow,
    message_session,
    peer_session,
    responder_flow_id,
)
from persistence.analytics.session_flows import MAX_SEQUENCE

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot

FINDING_COLUMNS = (
    "node",
    "kind",
    "flow_id",
    "session_id",
    "sequence",
    "counterparty",
    "detail",
)
"""The columns of the check's findings."""


def checkpoint_blobs(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Open the keyed nodes' checkpoint blobs and check what only they say (see the module).

    With each node's key (--key-file), its checkpoint blobs are opened as the node opens
    them: a blob whose MAC fails or that is stale or undecodable, a message recorded as
    consumed past what its sender's live checkpoint says it sent (consumed_unsent), and a
    message taken in, by the receiver's checkpoint or by the sender's count in a finished
    conversation, with no dedup id (missing_last_dedup_id), and a session a live initiator
    saw confirmed whose analyzed peer holds no responder flow (responder_lost) are findings.
    A node without a key is not checked.
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    keyed = [name for name in snapshot.node_names if name in snapshot.checkpoint_keys]
    unkeyed = [name for name in snapshot.node_names if name not in snapshot.checkpoint_keys]
    not_checked = f"not checked: no key for {', '.join(unkeyed)}" if unkeyed else ""
    if not keyed:
        empty = snapshot.spark.createDataFrame(
            [],
            "node string, kind string, flow_id string, session_id string, sequence bigint, "
            "counterparty string, detail string",
        )
        summary = "not checked: no key (give --key-file NODE=PATH) for " + ", ".join(unkeyed)
        return CheckResult(
            "checkpoint_blobs",
            "Checkpoint blobs (with the node's key)",
            empty,
            Verdict(INFO, summary),
            # nothing to collect: the report asks Spark nothing (on a cold JVM, planning and
            # compiling even an empty frame's collection took a second)
            first=FirstRows((), complete=True),
        )
    facts = read_blob_facts(snapshot, {name: snapshot.checkpoint_keys[name] for name in keyed})
    snapshot.on_close(facts.problems.unpersist)
    snapshot.on_close(facts.sessions.unpersist)
    refused = facts.problems.select(
        "node",
        "kind",
        "flow_id",
        F.lit(None).cast("string").alias("session_id"),
        F.lit(None).cast("bigint").alias("sequence"),
        F.lit(None).cast("string").alias("counterparty"),
        "detail",
    )
    unsent = _consumed_unsent(snapshot, facts.sessions, settings)
    frame = (
        refused.unionByName(unsent)
        .unionByName(_behind_dedup_ids(snapshot, facts.sessions, unsent))
        .unionByName(_missing_last(snapshot, facts.sessions))
        .unionByName(_missing_last_by_sender(snapshot, facts.sessions, settings))
        .unionByName(_responder_lost(snapshot, facts.sessions, settings))
    )
    frame = keep_in_order(snapshot, frame, "kind", "node", "flow_id", "session_id", "sequence")
    counts, first = count_with_first_rows(frame, "kind", settings.report_rows)
    found = sum(counts.values())
    blobs = sum(facts.blobs.values())
    read = f"{blobs} blob{'s' if blobs != 1 else ''} of {', '.join(keyed)} opened"
    if found:
        parts = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        summary = f"{found} finding{'s' if found != 1 else ''}: {parts} ({read})"
        verdict = Verdict(FAIL, summary + (f"; {not_checked}" if unkeyed else ""), found)
    elif unkeyed:
        verdict = Verdict(INFO, f"{read}: no finding; {not_checked}")
    else:
        verdict = Verdict(
            OK,
            f"{read}: every MAC matches, every message consumed was sent, "
            "every message taken in has its dedup id",
        )
    sessions = facts.sessions.groupBy("node").agg(
        F.countDistinct("flow_id").alias("flows"), F.count("*").alias("sessions")
    )
    return CheckResult(
        "checkpoint_blobs",
        "Checkpoint blobs (with the node's key)",
        frame,
        verdict,
        extras={"sessions": keep(snapshot, sessions)},
        first=first,
    )


def _consumed_unsent(snapshot: Snapshot, sessions: DataFrame, settings: CheckSettings) -> DataFrame:
    """Records of messages past what the sender's live checkpoint says it sent."""
    from pyspark.sql import functions as F

    judged_before = as_of_ms(snapshot, settings) - settings.grace_ms
    ids = snapshot.message_ids.where(F.col("inserted_at") <= judged_before)
    sent = sessions.select(
        F.col("node").alias("s_node"),
        F.col("flow_id").alias("s_flow"),
        F.col("session_id").alias("s_session"),
        F.col("sent"),
    )
    joined = ids.join(
        sent,
        (sent.s_node == ids.sender) & (sent.s_session == peer_session(ids.session_id)),
    ).where(F.col("sequence") >= F.col("sent"))
    return joined.select(
        "node",
        F.lit("consumed_unsent").alias("kind"),
        F.col("s_flow").alias("flow_id"),
        "session_id",
        "sequence",
        F.col("sender").alias("counterparty"),
        F.concat(
            F.lit("message "),
            F.col("sequence").cast("string"),
            F.lit(" recorded as consumed, but the sender's checkpoint (flow "),
            F.col("s_flow"),
            F.lit(") says it sent "),
            F.col("sent").cast("string"),
            F.lit(" on "),
            F.col("s_session"),
        ).alias("detail"),
    )


def _behind_dedup_ids(snapshot: Snapshot, sessions: DataFrame, unsent: DataFrame) -> DataFrame:
    """Checkpoints older than the dedup ids their own node wrote: an old blob *and* row.

    The node's own rule when it loads a checkpoint (``checkpoint_staleness``): a message
    recorded as consumed on one of the flow's sessions that the checkpoint has not taken in
    (at or past ``next_receive_sequence``, and not held early). The MAC cannot see this one:
    the row and the blob were put back together, so they agree on the version. A record
    that is ``consumed_unsent`` (its sender never sent it) is explained by that finding: the
    record is wrong, not the checkpoint.
    """
    from pyspark.sql import functions as F

    ids = snapshot.message_ids.select(
        F.col("node").alias("i_node"),
        F.col("session_id").alias("i_session"),
        F.col("sequence").alias("i_sequence"),
    )
    bogus = unsent.select(
        F.col("node").alias("i_node"),
        F.col("session_id").alias("i_session"),
        F.col("sequence").alias("i_sequence"),
    )
    ids = ids.join(bogus, ["i_node", "i_session", "i_sequence"], "left_anti")
    behind = (
        sessions.join(ids, (ids.i_node == sessions.node) & (ids.i_session == sessions.session_id))
        .where(
            (F.col("i_sequence") >= F.col("received"))
            & ~F.array_contains(F.col("early"), F.col("i_sequence"))
        )
        .groupBy("node", "flow_id", "session_id", "counterparty", "received")
        .agg(F.min("i_sequence").alias("sequence"))
    )
    return behind.select(
        "node",
        F.lit("stale_checkpoint").alias("kind"),
        "flow_id",
        "session_id",
        "sequence",
        "counterparty",
        F.concat(
            F.lit("stale checkpoint: message "),
            F.col("sequence").cast("string"),
            F.lit(" of session "),
            F.col("session_id"),
            F.lit(" was consumed, but this checkpoint expects message "),
            F.col("received").cast("string"),
            F.lit(" next (an older blob and row put back)"),
        ).alias("detail"),
    )


def _responder_lost(snapshot: Snapshot, sessions: DataFrame, settings: CheckSettings) -> DataFrame:
    """Sessions a live initiator saw confirmed whose analyzed peer holds no responder flow."""
    from pyspark.sql import functions as F

    judged_before = as_of_ms(snapshot, settings) - settings.grace_ms
    # the responder's id is made of the initiator's name: judged only for nodes whose name
    # is known (not a URL standing in for it)
    named = [node.name for node in snapshot.nodes if node.named_by != "unknown"]
    confirmed = sessions.where(
        F.col("initiated_by_us")
        & F.col("confirmed")
        & F.col("node").isin(*named)
        & F.col("counterparty").isin(*snapshot.node_names)
    ).withColumn("responder", responder_flow_id(F.col("node"), F.col("session_id")))
    # the confirmation's own dedup id (message 0 of our end), old enough that the peer's
    # snapshot cannot predate the responder's first commit, which sent it
    taken = snapshot.message_ids.where(
        (F.col("sequence") == 0) & (F.col("inserted_at") <= judged_before)
    ).select(
        F.col("node").alias("t_node"),
        F.col("session_id").alias("t_session"),
        F.col("inserted_at").alias("confirmed_at"),
    )
    confirmed = confirmed.join(
        taken, (taken.t_node == confirmed.node) & (taken.t_session == confirmed.session_id)
    )
    known = known_flows(snapshot).select(
        F.col("node").alias("k_node"), F.col("flow_id").alias("k_flow")
    )
    lost = confirmed.join(
        known,
        (known.k_node == confirmed.counterparty) & (known.k_flow == confirmed.responder),
        "left_anti",
    )
    return lost.select(
        "node",
        F.lit("responder_lost").alias("kind"),
        "flow_id",
        "session_id",
        F.lit(0).cast("bigint").alias("sequence"),
        "counterparty",
        F.concat(
            F.lit("the checkpoint took in "),
            F.col("counterparty"),
            F.lit("'s confirmation of the session at "),
            F.date_format(F.timestamp_millis(F.col("confirmed_at")), "yyyy-MM-dd HH:mm:ss'Z'"),
            F.lit(" (its responder "),
            F.col("responder"),
            F.lit(" had started), but "),
            F.col("counterparty"),
            F.lit(" holds no such flow, live or finished: its rows were lost"),
        ).alias("detail"),
    )


def _after(top: Column) -> Column:
    """The number after ``top``; ``top`` itself for the largest (a corrupt record: no error)."""
    from pyspark.sql import functions as F

    return F.when(top < MAX_SEQUENCE, top + 1).otherwise(top)


def _missing_last(snapshot: Snapshot, sessions: DataFrame) -> DataFrame:
    """Messages a live checkpoint took in, above its node's last dedup id, without one."""
    from pyspark.sql import functions as F

    ids = snapshot.message_ids
    top = ids.groupBy(F.col("node").alias("t_node"), F.col("session_id").alias("t_session")).agg(
        F.max("sequence").alias("top")
    )
    with_top = sessions.join(
        top, (top.t_node == sessions.node) & (top.t_session == sessions.session_id), "left"
    ).withColumn("first", F.coalesce(_after(F.col("top")), F.lit(0).cast("bigint")))
    in_order = F.when(
        F.col("received") > F.col("first"),
        F.sequence(F.col("first"), F.col("received") - 1),
    ).otherwise(F.array().cast("array<bigint>"))
    early = F.filter(F.col("early"), lambda sequence: sequence >= F.col("first"))
    candidates = with_top.select(
        "node",
        "flow_id",
        "session_id",
        "counterparty",
        "received",
        F.explode(F.array_union(in_order, early)).alias("sequence"),
    )
    recorded = ids.select(
        F.col("node").alias("r_node"),
        F.col("session_id").alias("r_session"),
        F.col("sequence").alias("r_sequence"),
    )
    missing = candidates.join(
        recorded,
        (recorded.r_node == candidates.node)
        & (recorded.r_session == candidates.session_id)
        & (recorded.r_sequence == candidates.sequence),
        "left_anti",
    )
    return missing.select(
        "node",
        F.lit("missing_last_dedup_id").alias("kind"),
        "flow_id",
        "session_id",
        "sequence",
        "counterparty",
        F.concat(
            F.lit("the checkpoint took in message "),
            F.col("sequence").cast("string"),
            F.lit(" (next expected "),
            F.col("received").cast("string"),
            F.lit("), but the node has no dedup id for it: a redelivery would be taken in again"),
        ).alias("detail"),
    )


def _missing_last_by_sender(
    snapshot: Snapshot, sessions: DataFrame, settings: CheckSettings
) -> DataFrame:
    """The last messages of finished conversations, by the sender's count, with no dedup id.

    Evidence that the receiver took in every message the sender counts, though its flow has
    finished (its blob is gone): the sender closed the session (its end is its last message)
    and never took in an end from the receiver, whose flow finished without one: a flow
    that finishes sends an end on every session whose peer has not ended it, so it had taken
    in the sender's end, and, in order, every message before it. Judged only when that
    cannot be an end still on its way: the receiver finished more than ``grace_ms`` before
    *as of*, its outbox holds nothing of the session, and the sender's node has since taken
    in a message from the receiver's node (so it is up and receives from it).
    """
    from pyspark.sql import functions as F

    judged_before = as_of_ms(snapshot, settings) - settings.grace_ms
    ids = snapshot.message_ids
    closed = sessions.where(
        F.col("closed_by_us") & ~F.col("peer_finished") & (F.col("sent") > 0)
    ).select(
        F.col("node").alias("sender"),
        F.col("flow_id").alias("sender_flow"),
        F.col("session_id").alias("sender_session"),
        F.col("counterparty").alias("node"),
        F.col("peer_session_id").alias("session_id"),
        counterpart_flow(F.col("node"), F.col("session_id")).alias("flow_id"),
        "sent",
    )
    finished = snapshot.results.select(
        F.col("node").alias("f_node"),
        F.col("flow_id").alias("f_flow"),
        F.col("completed_at").alias("ended_at"),
    ).unionByName(
        snapshot.exceptions.select(
            F.col("node").alias("f_node"),
            F.col("flow_id").alias("f_flow"),
            F.col("failed_at").alias("ended_at"),
        )
    )
    ended = closed.join(
        finished, (finished.f_node == closed.node) & (finished.f_flow == closed.flow_id)
    ).where(F.col("ended_at") <= judged_before)
    queued = snapshot.outbox.select(
        F.col("node").alias("q_node"), message_session(F.col("message_id")).alias("q_session")
    )
    ended = ended.join(
        queued,
        (queued.q_node == ended.node) & (queued.q_session == ended.session_id),
        "left_anti",
    )
    heard = ids.groupBy(F.col("node").alias("h_node"), F.col("sender").alias("h_from")).agg(
        F.max("inserted_at").alias("heard_at")
    )
    ended = ended.join(heard, (heard.h_node == ended.sender) & (heard.h_from == ended.node)).where(
        F.col("heard_at") > F.col("ended_at")
    )
    top = ids.groupBy(F.col("node").alias("t_node"), F.col("session_id").alias("t_session")).agg(
        F.max("sequence").alias("top")
    )
    ended = ended.join(
        top, (top.t_node == ended.node) & (top.t_session == ended.session_id), "left"
    ).withColumn("first", F.coalesce(_after(F.col("top")), F.lit(0).cast("bigint")))
    missing = ended.where(F.col("sent") > F.col("first")).select(
        "node",
        "flow_id",
        "session_id",
        "sender",
        "sender_flow",
        "sender_session",
        "sent",
        F.explode(F.sequence(F.col("first"), F.col("sent") - 1)).alias("sequence"),
    )
    return missing.select(
        "node",
        F.lit("missing_last_dedup_id").alias("kind"),
        "flow_id",
        "session_id",
        "sequence",
        F.col("sender").alias("counterparty"),
        F.concat(
            F.lit("the sender's checkpoint (flow "),
            F.col("sender_flow"),
            F.lit(") says it sent "),
            F.col("sent").cast("string"),
            F.lit(" on "),
            F.col("sender_session"),
            F.lit(
                " and closed it; this finished flow took in its end without answering one"
                ", but the node has no dedup id for message "
            ),
            F.col("sequence").cast("string"),
        ).alias("detail"),
    )
