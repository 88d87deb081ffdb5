"""The session ownership check: a node consumed messages only in sessions it holds (``fail``).

``node_message_ids`` records every message a node consumed, with the session end it was
consumed in (our side of the session) and its sender. The node must hold the flow of that
end, live or finished:

* a responder end ``S.r`` (the sender opened ``S``): the responder flow the node started for
  it, whose id is the UUID5 of ``"<sender>|S"``
  (:func:`~persistence.analytics.session_columns.responder_flow_id`);
* an initiator end ``S`` (replies to a session the node opened): the initiating flow ``S``
  names (:func:`~persistence.analytics.session_columns.session_flow`).

The one legitimate exception is a refused session: a node with no responder registered for
the initiating flow (or a draining node) records the initial message (sequence 0) of ``S.r``
and answers with a rejection, starting no flow (``reject_initial_session`` in
``statemachine/transitions/starting.py``). So a responder end in which only sequence 0 was
consumed and no flow is held is counted as ``refused`` and not judged, unless the initiating
flow's row says the session was confirmed (its session facts:
:mod:`persistence.analytics.flow_facts`): then a responder ran, confirmed, and is gone
(``unowned``). Without the facts (rows written before they were kept) it looks the same as
a one-message responder whose records were lost. A message that arrives after its flow
ended is dropped unrecorded, so it leaves no row to judge.

A message is also misdirected when solid evidence names another target than the node that
consumed it: the sender's own tables show its end of the session (it waits on it, consumed
a message of it, or queues one for it: :func:`~persistence.analytics.evidence.session_ends`)
with another counterparty, or the consumed end is an initiator end whose session id carries
the identity tag of another node (a node only opens sessions tagged with its own name's
tag; judged only for nodes whose name is known, not a URL standing in for it).

A session has one responder, so a responder end (its session and sender) consumed on two or
more nodes is judged too, where no evidence above already names the wrong ones: a node that
holds no flow for the end while another does is ``misdirected`` (the holder was the target);
when none of them holds the responder flow (each looks like a refusal), or more than one
does, each is ``contested``: at most one of them was the target, and the tables do not say
which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.candidates import candidate_snapshot
from persistence.analytics.check_results import (
    FAIL,
    OK,
    CheckResult,
    CheckSettings,
    Verdict,
    keep,
    keep_in_order,
    small_frame,
)
from persistence.analytics.evidence import judged_session_ends, known_flows
from persistence.analytics.flow_facts import confirmations
from persistence.analytics.screening import screen
from persistence.analytics.session_columns import (
    initiator_session,
    is_responder,
    peer_session,
    responder_flow_id,
    session_flow,
)
from statemachine.session_ids import TAG_LENGTH, identity_tag

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot

UNOWNED = "unowned"
"""Messages consumed in a session end the node holds no flow for."""
MISDIRECTED = "misdirected"
"""Messages consumed by a node that evidence shows was not their target."""
CONTESTED = "contested"
"""Messages of one responder end consumed by two or more nodes, none of them (or more than
one) holding its responder flow and no evidence naming the wrong ones: at most one of them
was the target."""
BROADCAST_ROWS = 200_000
"""Up to this many consumed session ends with evidence of another target, they are joined
to the others through a broadcast (no shuffle); more use a plain join."""


def session_tag(session: Column) -> Column:
    """The identity tag an initiator or responder session id carries (empty when untagged)."""
    from pyspark.sql import functions as F

    return F.regexp_extract(initiator_session(session), rf"^([0-9a-f]{{{TAG_LENGTH}}})-", 1)


def session_ownership(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Session ownership: every consumed message's session end has its flow on that node.

    One row per (node, session end, sender) with a finding: ``kind`` ``misdirected`` (the
    sender's tables, the session's tag or the node holding the responder flow name another
    target, listed in ``target``), ``contested`` (a responder end consumed on several nodes,
    none or more than one of them holding its flow: the others in ``target``) or
    ``unowned`` (no flow for the end, live or finished, and not a refused session), the
    flow that should hold the end (``flow_id``), how many messages were consumed and their
    sequence numbers, and a one-line ``reason``. ``extras["summary"]`` counts the consumed
    session ends by outcome (``owned``, ``refused``, ``unowned``, ``misdirected``,
    ``contested``). ``fail`` when any finding.
    """
    settings = settings or CheckSettings()
    found = screen(snapshot, settings)
    findings, counts = judge_consumed(candidate_snapshot(snapshot, settings))
    counts["owned"] = counts.get("owned", 0) + found.consumed_owned
    counts = {outcome: n for outcome, n in counts.items() if n}
    summary = keep(
        snapshot,
        small_frame(
            snapshot, (("outcome", "string"), ("session_ends", "bigint")), sorted(counts.items())
        ),
    )
    unowned = sum(counts.get(kind, 0) for kind in (UNOWNED, MISDIRECTED, CONTESTED))
    detail = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    if unowned:
        verdict = Verdict(
            FAIL,
            f"{unowned} consumed session end{'s' if unowned != 1 else ''} not held by the node "
            f"({detail})",
            unowned,
        )
    else:
        verdict = Verdict(
            OK, f"every consumed message's session end is held ({detail or 'no messages'})"
        )
    return CheckResult(
        "session_ownership",
        "Session ownership of consumed messages",
        findings,
        verdict,
        extras={"summary": summary},
    )


def judge_consumed(snapshot: Snapshot) -> tuple[DataFrame, dict[str, int]]:
    """The full rules on every consumed session end of ``snapshot``: (findings, counts).

    ``snapshot`` is the candidates' (:mod:`persistence.analytics.candidates`); the counts are
    of consumed session ends by outcome.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    consumed = (
        snapshot.message_ids.where(session_flow(F.col("session_id")) != "")
        .groupBy("node", "session_id", "sender")
        .agg(
            F.count("*").alias("messages"),
            F.min("sequence").alias("first_sequence"),
            F.max("sequence").alias("last_sequence"),
            F.max("inserted_at").alias("last_at"),
        )
    )
    responder = is_responder(F.col("session_id"))
    consumed = consumed.withColumn(
        "role", F.when(responder, "responder").otherwise("initiator")
    ).withColumn(
        "flow_id",
        F.when(
            responder, responder_flow_id(F.col("sender"), initiator_session(F.col("session_id")))
        ).otherwise(session_flow(F.col("session_id"))),
    )
    known = known_flows(snapshot).select("node", "flow_id", F.col("status").alias("owner_status"))
    consumed = consumed.join(known, ["node", "flow_id"], "left")
    # what the initiating flow's row says of a responder end: its responder confirmed it
    said = confirmations(snapshot)
    consumed = consumed.join(
        said,
        (said.f_node == consumed.sender)
        & (said.f_session == peer_session(consumed.session_id))
        & responder,
        "left",
    ).drop("f_node", "f_session")
    confirmed = F.coalesce(F.col("confirmed"), F.lit(False))
    # the sender's own ends of the session with another counterparty than this node (the
    # shared, cached judged ends: the same rows as session_ends): an inner join finds the
    # few ends that name another target, gathered for those ends only
    ends = judged_session_ends(snapshot).select(
        F.col("node").alias("e_node"),
        F.col("session_id").alias("e_session"),
        F.col("counterparty").alias("e_target"),
    )
    consumers = snapshot.message_ids.where(session_flow(F.col("session_id")) != "").select(
        F.col("node").alias("m_node"),
        F.col("session_id").alias("m_session"),
        F.col("sender").alias("m_sender"),
    )
    elsewhere = keep(
        snapshot,
        consumers.join(
            ends,
            (ends.e_node == consumers.m_sender)
            & (ends.e_session == peer_session(consumers.m_session))
            & (ends.e_target != consumers.m_node),
        )
        .groupBy("m_node", "m_session", "m_sender")
        .agg(F.sort_array(F.collect_set("e_target")).alias("m_targets")),
    )
    few = elsewhere.count() <= BROADCAST_ROWS
    consumed = consumed.join(
        F.broadcast(elsewhere) if few else elsewhere,
        (elsewhere.m_node == consumed.node)
        & (elsewhere.m_session == consumed.session_id)
        & (elsewhere.m_sender == consumed.sender),
        "left",
    )
    consumed = consumed.withColumn(
        "targets", F.coalesce(F.col("m_targets"), F.array().cast("array<string>"))
    ).drop("m_node", "m_session", "m_sender", "m_targets")
    # a responder end has one responder: the same end (session and sender) consumed on two or
    # more nodes, where the sender's evidence names none of them as wrong, is judged by who
    # holds the responder flow: the others took what was meant for its holder, and when no
    # node or more than one holds it, the end is contested (at most one was its target)
    end = Window.partitionBy("session_id", "sender")
    owns = F.col("owner_status").isNotNull()
    consumed = (
        consumed.withColumn("g_consumers", F.collect_set("node").over(end))
        .withColumn("g_owners", F.collect_set(F.when(owns, F.col("node"))).over(end))
        .withColumn("g_evidence", F.max(F.size("targets")).over(end))
    )
    others = F.array_remove(F.col("g_consumers"), F.col("node"))
    other_owners = F.array_remove(F.col("g_owners"), F.col("node"))
    shared = (F.col("role") == "responder") & (F.size(others) > 0) & (F.col("g_evidence") == 0)
    taken = shared & ~owns & (F.size(other_owners) > 0)
    contested = shared & ~taken & (~owns | (F.size(other_owners) > 0))
    # a named node's initiator ends carry its own tag: another analyzed node's tag names it
    named = [n.name for n in snapshot.nodes if n.named_by != "unknown"]
    tags = {identity_tag(name): name for name in snapshot.node_names}
    tag = session_tag(F.col("session_id"))
    tag_target = (
        F.element_at(F.create_map(*[F.lit(x) for pair in tags.items() for x in pair]), tag)
        if tags
        else F.lit(None).cast("string")
    )
    wrong_tag = (
        (F.col("role") == "initiator")
        & F.col("node").isin(*named)
        & (tag != "")
        & (tag != F.substring(F.sha2(F.col("node"), 256), 1, TAG_LENGTH))
    )
    target = (
        F.when(
            wrong_tag,
            F.array_distinct(
                F.concat(
                    F.array(F.coalesce(tag_target, F.concat(F.lit("the node tagged "), tag))),
                    F.col("targets"),
                )
            ),
        )
        .when(taken, other_owners)
        .when(contested & owns, other_owners)
        .when(contested, others)
    )
    target = target.otherwise(F.col("targets"))
    consumed = consumed.withColumn("target", F.array_join(target, ", ")).withColumn(
        "contested", contested
    )
    outcome = (
        F.when(F.col("contested"), CONTESTED)
        .when(F.col("target") != "", MISDIRECTED)
        .when(F.col("owner_status").isNotNull(), "owned")
        .when(
            (F.col("role") == "responder") & (F.col("last_sequence") == 0) & ~confirmed, "refused"
        )
        .otherwise(UNOWNED)
    )
    consumed = consumed.withColumn("outcome", outcome)
    which = F.when(F.col("role") == "responder", "responder").otherwise("initiating")
    reason = (
        F.when(
            F.col("outcome") == CONTESTED,
            F.concat(
                F.lit("consumed "),
                F.col("messages").cast("string"),
                F.lit(" message(s) of "),
                F.col("sender"),
                F.lit("'s session, "),
                F.when(
                    F.col("owner_status").isNotNull(), F.lit("holding its responder flow, ")
                ).otherwise(F.lit("holding no flow for it, ")),
                F.lit("as did "),
                F.col("target"),
                F.lit(": a session has one responder, so at most one of them was its target"),
            ),
        )
        .when(
            F.col("outcome") == MISDIRECTED,
            F.concat(
                F.lit("consumed "),
                F.col("messages").cast("string"),
                F.lit(" message(s) of "),
                F.col("sender"),
                F.lit("'s session meant for "),
                F.col("target"),
            ),
        )
        .otherwise(
            F.concat(
                F.lit("consumed "),
                F.col("messages").cast("string"),
                F.lit(" message(s) from "),
                F.col("sender"),
                F.lit(" but holds no "),
                which,
                F.lit(" flow "),
                F.col("flow_id"),
                F.lit(" (live or finished)"),
                F.when(
                    confirmed & (F.col("role") == "responder"),
                    F.lit(", though the initiating flow's row says it confirmed the session"),
                ).otherwise(F.lit("")),
            )
        )
    )
    columns: list[Column | str] = [
        "node",
        "flow_id",
        "session_id",
        F.col("outcome").alias("kind"),
        "target",
        "role",
        "sender",
        "messages",
        "first_sequence",
        "last_sequence",
        "last_at",
        reason.alias("reason"),
    ]
    # cached narrow: every end's outcome, and the finding's columns only where it is one
    is_finding = F.col("outcome").isin(UNOWNED, MISDIRECTED, CONTESTED)
    judged = keep(
        snapshot,
        consumed.select("outcome", F.when(is_finding, F.struct(*columns)).alias("finding")),
    )
    findings = keep_in_order(
        snapshot,
        judged.where(F.col("finding").isNotNull()).select("finding.*"),
        "node",
        "session_id",
        "sender",
    )
    counted = judged.groupBy("outcome").agg(F.count("*").alias("n")).collect()
    return findings, {row["outcome"]: int(row["n"]) for row in counted}
