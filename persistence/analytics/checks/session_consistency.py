"""The cross-node session consistency check: every session end has its counterpart (``fail``).

A session end one node's tables show (:func:`~persistence.analytics.evidence.session_ends`)
needs the flow that holds the other end on the counterparty's node: the initiating flow for
a responder end, the responder flow the node started (its id derived from the initiator's
session, :func:`~persistence.analytics.session_columns.responder_flow_id`) for an initiator
end. One missing is an orphan (a conversation one side believes open and the other never
had, or lost) when the counterparty demonstrably had the opening message in hand (it
consumed it, or it is the responder's end); otherwise the opening message may still wait
in the transport: to a node that is down ("not delivered yet"), or to one that runs but has
not taken it in yet, a backlog after a restart say ("unconfirmed"). The node tables cannot
tell a message waiting in the transport from one lost there, so neither is a failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.candidates import candidate_snapshot
from persistence.analytics.check_results import (
    FAIL,
    OK,
    WARN,
    CheckResult,
    CheckSettings,
    Verdict,
    as_of_ms,
    is_analyzed,
    keep,
    keep_in_order,
    small_frame,
)
from persistence.analytics.evidence import judged_session_ends
from persistence.analytics.flow_facts import confirmations
from persistence.analytics.screening import screen
from persistence.analytics.session_columns import expected_message_id, session_flow

BROADCAST_ROWS = 200_000
"""Up to this many session ends without a known counterpart, the other tables are filtered
by them through a broadcast (a scan, no shuffle of the big tables); more use plain joins."""

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from persistence.analytics.snapshot import Snapshot

ORPHAN = "orphan"
"""A session end whose counterpart is missing on a counterparty that had the chance to
create it (``fail``)."""
NOT_DELIVERED = "not delivered yet"
"""An initiator end whose responder is missing on a counterparty that has not run since the
send (its lease was last renewed before it) and recorded nothing from us since (``warn``)."""
UNCONFIRMED = "unconfirmed"
"""An initiator end whose responder is missing on a counterparty that did not consume the
opening message, but may have run since the send (no lease row, or one renewed since):
the message waits in the transport or was lost there (``warn``)."""

REFUSED_OR_LOST = "refused or lost"
"""An initiator end whose opening message the counterparty consumed without holding a flow
for it, while our flow, live, took one message in from it, no longer waits on the session
and keeps no session facts (a row written before they were kept): a refusal the flow caught
and went on from, or a responder that confirmed (its one message) and lost its rows
(``warn``). With the facts the row tells: never confirmed is ``ok (refused)``, confirmed an
``orphan`` (its responder ran, and is gone)."""


def session_consistency(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Cross-node session consistency: every session seen has its counterpart.

    For each session end a node's tables show (:func:`session_ends`) with a counterparty
    among the analyzed nodes, the flow holding the other end must be known there (live,
    completed or failed):

    * a responder end ``X.r`` needs the initiating flow (``X`` without ``.sN``);
    * an initiator end ``X`` needs the responder flow (UUID5 of ``"<node>|X"``), unless the
      peer consumed the initial message, our node took in at most one message on the end
      and our flow has ended (the peer refused the session), or the initial message still
      waits in our outbox (in flight).

    Ends whose earliest evidence is newer than ``grace_ms`` before ``as_of`` are not judged
    (messages may be in the transport). An end without its counterpart is an orphan when the
    counterparty had the opening message in hand: a responder end, or an initiator end whose
    opening message the counterparty consumed (unless it refused the session: our flow ended,
    or its session facts say the session was never confirmed; a live flow without facts that
    took one message in and no longer waits on the session is ``refused or lost``: a
    warning), or one our flow's facts say its responder confirmed. An initiator end
    whose counterparty's lease (``node_workers``) was last renewed before it, and which
    recorded nothing from us since, is ``not delivered yet``; otherwise ``unconfirmed`` (it
    may have run since: running is not receiving, a node catching up on a backlog runs).
    The frame lists the orphans, then the other two, with both node names;
    ``extras["summary"]`` counts every end by outcome. ``fail`` when any orphan is found,
    ``warn`` when only ends not delivered yet or unconfirmed.
    """
    settings = settings or CheckSettings()
    found = screen(snapshot, settings)
    orphans, counts = judge_ends(candidate_snapshot(snapshot, settings), settings)
    counts["ok"] = counts.get("ok", 0) + found.ends_ok
    counts["not analyzed"] = counts.get("not analyzed", 0) + found.ends_not_analyzed
    counts = {outcome: n for outcome, n in counts.items() if n}
    summary_frame = keep(
        snapshot,
        small_frame(
            snapshot, (("outcome", "string"), ("sessions", "bigint")), sorted(counts.items())
        ),
    )
    found_orphans = counts.get(ORPHAN, 0)
    waiting = sum(counts.get(outcome, 0) for outcome in (NOT_DELIVERED, UNCONFIRMED))
    waiting += counts.get(REFUSED_OR_LOST, 0)
    detail = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    if found_orphans:
        verdict = Verdict(
            FAIL,
            f"{found_orphans} session end{'s' if found_orphans != 1 else ''} without a "
            f"counterpart ({detail})",
            found_orphans + waiting,
        )
    elif waiting:
        verdict = Verdict(
            WARN,
            f"{waiting} session end{'s' if waiting != 1 else ''} without a counterpart "
            f"the tables cannot call lost ({detail})",
            waiting,
        )
    else:
        verdict = Verdict(OK, f"every session end has its counterpart ({detail or 'no sessions'})")
    return CheckResult(
        "session_consistency",
        "Cross-node session consistency",
        orphans,
        verdict,
        extras={"summary": summary_frame},
    )


def judge_ends(snapshot: Snapshot, settings: CheckSettings) -> tuple[DataFrame, dict[str, int]]:
    """The full rules on every session end of ``snapshot``: (the findings, ends by outcome).

    ``snapshot`` is the candidates' (:mod:`persistence.analytics.candidates`); the latest
    record per node and sender is read from the whole snapshot.
    """
    from pyspark.sql import functions as F

    as_of = as_of_ms(snapshot, settings)
    ends = judged_session_ends(snapshot)
    analyzed = is_analyzed(snapshot, F.col("counterparty"))
    resolved = (
        ends.where(~analyzed | F.col("counterpart_status").isNotNull())
        .groupBy(F.when(~analyzed, "not analyzed").otherwise("ok").alias("outcome"))
        .agg(F.count("*").alias("sessions"))
    )
    # the few ends whose counterpart is not known: look up the rest for them only
    open_ends = keep(snapshot, ends.where(analyzed & F.col("counterpart_status").isNull()))
    open_count = open_ends.count()
    small = open_count <= BROADCAST_ROWS
    narrow = F.broadcast if small else (lambda frame: frame)
    initial_id = expected_message_id(F.col("session_id"), F.lit(0))
    wanted = open_ends.select(
        "node",
        "counterparty",
        session_flow(F.col("session_id")).alias("own_flow"),
        initial_id.alias("initial_id"),
    )
    own_keys = narrow(wanted.select(F.col("node").alias("w_node"), F.col("own_flow").alias("w")))
    own = (
        snapshot.checkpoints.join(
            own_keys,
            (F.col("node") == F.col("w_node")) & (F.col("flow_id") == F.col("w")),
            "left_semi",
        )
        .select(F.col("node").alias("o_node"), F.col("flow_id").alias("o_flow"))
        .distinct()
        .withColumn("own_live", F.lit(True))
    )
    sent_keys = narrow(
        wanted.select(F.col("counterparty").alias("w_node"), F.col("initial_id").alias("w"))
    )
    consumed = (
        snapshot.message_ids.join(
            sent_keys,
            (F.col("node") == F.col("w_node")) & (F.col("message_id") == F.col("w")),
            "left_semi",
        )
        .select(F.col("node").alias("c_node"), F.col("message_id").alias("c_id"))
        .distinct()
        .withColumn("initial_consumed", F.lit(True))
    )
    queued = (
        snapshot.outbox.select(F.col("node").alias("q_node"), F.col("message_id").alias("q_id"))
        .distinct()
        .withColumn("initial_queued", F.lit(True))
    )
    ends = open_ends.join(
        own,
        (own.o_node == open_ends.node) & (own.o_flow == session_flow(open_ends.session_id)),
        "left",
    ).drop("o_node", "o_flow")
    ends = ends.join(
        consumed, (consumed.c_node == ends.counterparty) & (consumed.c_id == initial_id), "left"
    ).drop("c_node", "c_id")
    ends = ends.join(
        queued, (queued.q_node == ends.node) & (queued.q_id == initial_id), "left"
    ).drop("q_node", "q_id")
    # the highest number our node consumed on the end: a refusal is one message (number 0)
    open_keys = narrow(
        open_ends.select(F.col("node").alias("w_node"), F.col("session_id").alias("w"))
    )
    answered = (
        snapshot.message_ids.join(
            open_keys,
            (F.col("node") == F.col("w_node")) & (F.col("session_id") == F.col("w")),
            "left_semi",
        )
        .groupBy(F.col("node").alias("r_node"), F.col("session_id").alias("r_session"))
        .agg(F.max("sequence").alias("received_top"))
    )
    ends = ends.join(
        narrow(answered),
        (answered.r_node == ends.node) & (answered.r_session == ends.session_id),
        "left",
    ).drop("r_node", "r_session")
    # what our flow's row says of the session (its facts): whether the responder confirmed it
    said = confirmations(snapshot)
    said = said.join(
        open_keys, (said.f_node == open_keys.w_node) & (said.f_session == open_keys.w), "left_semi"
    )
    ends = ends.join(
        narrow(said), (said.f_node == ends.node) & (said.f_session == ends.session_id), "left"
    ).drop("f_node", "f_session")
    # what the counterparty's own tables say of it: when its lease was last renewed, and
    # when it last recorded a message from this node (small: one row per node, per pair)
    alive = snapshot.workers.groupBy("node").agg(F.max("renewed_at").alias("a_last"))
    alive = alive.select(F.col("node").alias("a_node"), F.col("a_last").alias("last_alive_ms"))
    # the latest record per node and sender needs every record (none to judge: none read);
    whole = snapshot.whole if open_count else snapshot
    heard = (
        whole.message_ids.select("node", F.xxhash64("sender").alias("sender_key"), "inserted_at")
        .groupBy("node", "sender_key")
        .agg(F.max("inserted_at").alias("last_from_us_ms"))
    )
    heard = heard.select(
        F.col("node").alias("h_node"), F.col("sender_key").alias("h_sender"), "last_from_us_ms"
    )
    ends = ends.join(F.broadcast(alive), alive.a_node == ends.counterparty, "left").drop("a_node")
    ends = ends.join(
        F.broadcast(heard),
        (heard.h_node == ends.counterparty) & (heard.h_sender == F.xxhash64(ends.node)),
        "left",
    ).drop("h_node", "h_sender")
    initiator = F.col("role") == "initiator"
    since, grace = F.col("since_ms"), settings.grace_ms
    heard_since = F.coalesce(F.col("last_from_us_ms") > since, F.lit(False))
    # the counterparty refused the session (it consumed our opening message, has no flow
    # for it and answered so, with one message) and our flow ended. More than one message
    # taken in from it: its responder ran, and is gone
    evidence = F.col("evidence")
    handled = F.array_contains(evidence, "received") & ~F.array_contains(evidence, "waiting")
    answered_once = F.col("initial_consumed").isNotNull() & (
        F.coalesce(F.col("received_top"), F.lit(0)) == 0
    )
    # our flow's row says whether the peer's responder confirmed the session (its facts;
    # null in rows written before they were kept): confirmed, it ran; never, it refused
    confirmed = F.coalesce(F.col("confirmed"), F.lit(False))
    never_confirmed = F.col("confirmed").isNotNull() & ~F.col("confirmed")
    refused = initiator & answered_once & ~confirmed
    outcome = (
        F.when(refused & (F.col("own_live").isNull() | (handled & never_confirmed)), "ok (refused)")
        .when(initiator & F.col("initial_queued").isNotNull(), "in flight")
        .when(since > as_of - grace, "too recent")
        # a live flow without facts that took one message in and went on: a refusal it
        # caught, or a responder that answered once and whose rows were lost
        .when(refused & handled, REFUSED_OR_LOST)
        # the counterparty had the opening message in hand: a responder end (the initiator
        # had to run to open it), an initiator end whose opening message it consumed, or
        # one whose responder confirmed the session
        .when(~initiator | F.col("initial_consumed").isNotNull() | confirmed, ORPHAN)
        # not consumed: it waits in the transport (or was lost there), which the node tables
        # cannot tell apart; a node that runs may still be behind (a backlog after a restart,
        # a partitioned queue, a message held for a retry), so running is no proof of loss.
        # Its lease was last renewed before the send and it recorded nothing from us since:
        .when((F.col("last_alive_ms") < since) & ~heard_since, NOT_DELIVERED)
        .otherwise(UNCONFIRMED)
    )
    ends = keep(snapshot, ends.withColumn("outcome", outcome))
    last_alive = F.date_format(F.timestamp_millis(F.col("last_alive_ms")), "yyyy-MM-dd HH:mm:ss'Z'")
    waits = F.concat(F.lit("the opening message waits in the transport to "), F.col("counterparty"))
    problem = (
        F.when(
            F.col("outcome") == ORPHAN,
            F.concat(
                F.lit("no flow "),
                F.col("counterpart_flow_id"),
                F.lit(" on "),
                F.col("counterparty"),
                F.lit(" holds the other end"),
                F.when(
                    confirmed,
                    F.lit(
                        ", which confirmed the session (our flow's row says so): its rows were lost"
                    ),
                ).otherwise(F.lit("")),
            ),
        )
        .when(
            F.col("outcome") == NOT_DELIVERED,
            F.concat(
                waits,
                F.lit(" (last alive at "),
                last_alive,
                F.lit(", nothing recorded from "),
                F.col("node"),
                F.lit(" since)"),
            ),
        )
        .when(
            F.col("outcome") == REFUSED_OR_LOST,
            F.concat(
                F.col("counterparty"),
                F.lit(" consumed the opening message and holds no flow "),
                F.col("counterpart_flow_id"),
                F.lit("; our flow took one message in from it and went on: a refusal it "),
                F.lit("caught, or a responder that confirmed and lost its rows (with our "),
                F.lit("key, checkpoint_blobs tells: responder_lost)"),
            ),
        )
        .when(
            (F.col("last_alive_ms") > since) | heard_since,
            F.concat(
                F.lit("not consumed by "),
                F.col("counterparty"),
                F.lit(", which ran since the send ("),
                F.when(
                    F.col("last_alive_ms") > since, F.concat(F.lit("last alive at "), last_alive)
                ).otherwise(
                    F.concat(
                        F.lit("recorded a message from "),
                        F.col("node"),
                        F.lit(" at "),
                        F.date_format(
                            F.timestamp_millis(F.col("last_from_us_ms")), "yyyy-MM-dd HH:mm:ss'Z'"
                        ),
                    )
                ),
                F.lit("): the opening message waits in the transport (a backlog, a message "),
                F.lit("held for a retry) or was lost there; the transport's queues tell"),
            ),
        )
        .otherwise(
            F.concat(
                waits,
                F.lit("? no flow there, but no evidence it ran since the send ("),
                F.coalesce(
                    F.concat(F.lit("last alive at "), last_alive),
                    F.lit("no lease row: stopped cleanly or never started"),
                ),
                F.lit(")"),
            )
        )
    )
    listed = (ORPHAN, NOT_DELIVERED, UNCONFIRMED, REFUSED_OR_LOST)
    orphans = ends.where(F.col("outcome").isin(*listed)).select(
        "node",
        "session_id",
        "outcome",
        "counterparty",
        "counterpart_flow_id",
        "role",
        F.array_join("evidence", ",").alias("evidence"),
        "since_ms",
        (F.lit(as_of) - F.col("since_ms")).alias("waited_ms"),
        "last_alive_ms",
        problem.alias("problem"),
    )
    orphans = keep_in_order(snapshot, orphans, F.col("outcome") != ORPHAN, "node", "session_id")
    judged = ends.groupBy("outcome").agg(F.count("*").alias("sessions"))
    counted = judged.unionByName(resolved).groupBy("outcome").agg(F.sum("sessions").alias("n"))
    return orphans, {row["outcome"]: int(row["n"]) for row in counted.collect()}
