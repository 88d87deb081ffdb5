"""The exactly-once audit of the dedup ids and the outbox (``fail``; ``warn`` for old outbox rows).

Each consumed message is recorded (``node_message_ids``) with its deterministic id, its
session and its sequence number, in the transaction that consumed it; each sent one waits
in the outbox until the transport took it. The audit looks for what the primary key cannot
stop: a message consumed twice (under two ids, or where the key is gone), an id reused or
not of the grammar, a sequence number never consumed below later ones, a record of a message
its sender's flow says it never sent, a message a flow took in without its dedup id (by the
facts each flow's row keeps of its sessions: :mod:`persistence.analytics.flow_facts`), and
outbox rows left behind. An old outbox row alone is a warning: the message waits, durable,
for a sender that is down, a target it cannot reach yet or shares no key with yet, and
nothing is lost or done twice (a row left behind after its target consumed it is sent again
and dropped by id).
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
    count_with_first_rows,
    duration,
    is_analyzed,
    keep,
    keep_in_order,
)
from persistence.analytics.flow_facts import consumed_unsent, missing_last
from persistence.analytics.session_columns import (
    expected_message_id,
    initiator_session,
    is_responder,
    message_sequence,
    message_session,
    peer_session,
    responder_flow_id,
    session_flow,
)

GAPS_LISTED = 1_000
"""At most this many missing numbers of one session are findings (the detail says how
many are missing in all): a corrupt record numbered near 2**63 must not list billions."""

BROADCAST_ROWS = 200_000
"""Up to this many irregular ids, every record is filtered by them through a broadcast (a
scan, no shuffle) when the audit looks for reused ids; more use a plain join."""

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot


def exactly_once_audit(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """The exactly-once audit of the dedup ids and the outbox.

    Findings, one row each, by ``kind``:

    * ``consumed_twice``: one (session, sequence number) recorded more than once on a node
      (under two ids, or twice under one id where the primary key is missing);
    * ``id_reused``: one message id recorded for two different (session, sequence) pairs;
    * ``id_mismatch``: a recorded id that is not ``N-<sender's session>-<sequence>``;
    * ``sequence_gap``: a sequence number missing below the highest one consumed in a
      session (not judged within ``grace_ms``, nor while the message waits in the sender's
      outbox; at most :data:`GAPS_LISTED` a session);
    * ``bad_sequence``: a record numbered below 0;
    * ``consumed_unsent``: a record of message ``k`` of a session whose sender's flow (its
      checkpoint row, or its result or error row once it ended) says it sent ``k`` or fewer
      on it (not judged within ``grace_ms``);
    * ``missing_last_dedup_id``: a message a flow says it took in (its row's ``received``)
      with no dedup id above the last its node has for the session (below it: a gap);
    * ``undelivered``: an outbox message older than ``outbox_after_ms`` (the detail says
      whether the target already consumed it, i.e. only the row was left behind, and when
      the sender was last alive, and when its flow ended if it has);
    * ``written_after_end``: such an outbox message written after its flow had ended (by
      more than ``grace_ms``): a flow's messages are written in its own transactions, its
      last ones with its end, so no flow of the node wrote it.

    ``fail`` when any but ``undelivered`` is found; ``warn`` when only ``undelivered`` is: the
    message waits in the sender's outbox, durable, which breaks no promise. Only the
    screening's candidate conversations can have a finding
    (:mod:`persistence.analytics.screening`): the rules run on the snapshot restricted to
    them (:func:`audit_records`).
    """
    settings = settings or CheckSettings()
    return audit_records(candidate_snapshot(snapshot, settings), settings)


def audit_records(snapshot: Snapshot, settings: CheckSettings) -> CheckResult:
    """The audit's full rules on ``snapshot`` (a reused id is looked for in every record).

    The snapshot is small (the screening's candidates, or a snapshot too small to screen),
    so the rules are few queries of few stages: what a session consumed is grouped once by
    session (one shuffle, which both groupings by session share), and the ids only the
    irregular ones can share are looked for only when there is one.
    """
    from pyspark.sql import functions as F

    as_of = as_of_ms(snapshot, settings)
    ids = snapshot.message_ids
    by_session = ids.repartition("node", "session_id")
    twice = (
        by_session.groupBy("node", "session_id", "sequence")
        .agg(
            F.count("*").alias("times"),
            F.sort_array(F.collect_list("message_id")).alias("ids"),
            F.first("sender").alias("counterparty"),
            F.max("inserted_at").alias("at"),
        )
        .where(F.col("times") > 1)
    )
    twice = _findings(
        twice,
        "consumed_twice",
        message_ids=F.array_join("ids", " "),
        detail=F.concat(
            F.lit("message "),
            F.col("sequence").cast("string"),
            F.lit(" consumed "),
            F.col("times").cast("string"),
            F.lit(" times"),
        ),
    )
    expected = expected_message_id(peer_session(F.col("session_id")), F.col("sequence"))
    mismatch = _findings(
        ids.where(F.col("message_id") != expected),
        "id_mismatch",
        counterparty=F.col("sender"),
        message_ids=F.col("message_id"),
        at=F.col("inserted_at"),
        detail=F.concat(F.lit("expected "), expected),
    )
    gaps = _sequence_gaps(snapshot, by_session, as_of - settings.grace_ms)
    parts = [twice, mismatch, gaps, _bad_sequences(snapshot)]
    parts += [consumed_unsent(snapshot, settings), missing_last(snapshot)]
    reused = _reused_ids(snapshot, expected)
    if reused is not None:
        parts.append(reused)
    parts.append(_undelivered(snapshot, as_of, settings.outbox_after_ms, settings.grace_ms))
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part)
    frame = keep_in_order(snapshot, frame, "kind", "node", "session_id", "sequence")
    counts, first = count_with_first_rows(frame, "kind", settings.report_rows)
    found = sum(counts.values())
    if found:
        listed = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        broken = found - counts.get("undelivered", 0)
        verdict = Verdict(
            FAIL if broken else WARN,
            f"{found} exactly-once finding{'s' if found != 1 else ''}: {listed}"
            + ("" if broken else " (the messages wait in their sender's outbox)"),
            found,
        )
    else:
        verdict = Verdict(
            OK,
            "no message consumed twice or unsent, no malformed id, no sequence gap, no dedup "
            f"id missing, no outbox message older than {duration(settings.outbox_after_ms)}",
        )
    return CheckResult("exactly_once_audit", "Exactly-once audit", frame, verdict, first=first)


def _reused_ids(snapshot: Snapshot, expected: Column) -> DataFrame | None:
    """An id recorded for two (session, sequence) pairs; None when no id can be (no query).

    A row whose id is the one its pair gives (``N-<peer session>-<sequence>``, sequence >= 0)
    shares its id only with rows of the same pair, since the id spells the pair out; so only
    an irregular id can be reused, and the row it shares it with may be anywhere in the whole
    snapshot (not only among the candidates).
    """
    from pyspark.sql import functions as F

    ids = snapshot.message_ids
    regular = F.coalesce((F.col("message_id") == expected) & (F.col("sequence") >= 0), F.lit(False))
    irregular = keep(
        snapshot,
        ids.where(~regular)
        .select(F.col("node").alias("d_node"), F.col("message_id").alias("d_id"))
        .distinct(),
    )
    found = irregular.count()
    if not found:
        return None
    every = snapshot.whole.message_ids
    suspects = every.join(
        F.broadcast(irregular) if found <= BROADCAST_ROWS else irregular,
        (every.node == irregular.d_node) & (every.message_id == irregular.d_id),
        "left_semi",
    )
    pair = F.when(
        F.col("session_id").isNotNull() & F.col("sequence").isNotNull(),
        F.struct("session_id", "sequence"),
    )
    reused = (
        suspects.groupBy("node", "message_id")
        .agg(
            F.size(F.collect_set(pair)).alias("pairs"),
            F.first("session_id").alias("session_id"),
            F.first("sender").alias("counterparty"),
            F.max("inserted_at").alias("at"),
        )
        .where(F.col("pairs") > 1)
    )
    return _findings(
        reused,
        "id_reused",
        sequence=F.lit(None).cast("bigint"),
        message_ids=F.col("message_id"),
        detail=F.concat(
            F.lit("id recorded for "), F.col("pairs").cast("string"), F.lit(" messages")
        ),
    )


def _undelivered(snapshot: Snapshot, as_of: int, after_ms: int, grace_ms: int) -> DataFrame:
    """Outbox messages older than ``after_ms``, whether their target consumed them.

    The detail also says when their sender was last alive: down since the row was written
    when its lease was last renewed no later than ``grace_ms`` after it.
    """
    from pyspark.sql import functions as F

    ids = snapshot.message_ids
    old = snapshot.outbox.where(F.col("created_at") <= as_of - after_ms)
    consumed = ids.select(F.col("node").alias("t_node"), F.col("message_id").alias("t_id"))
    taken = (consumed.t_node == old.target) & (consumed.t_id == old.message_id)
    old = (
        old.join(consumed, taken, "left_semi")
        .withColumn("delivered", F.lit(True))
        .unionByName(old.join(consumed, taken, "left_anti").withColumn("delivered", F.lit(False)))
    )
    alive = snapshot.whole.workers.groupBy(F.col("node").alias("a_node")).agg(
        F.max("renewed_at").alias("last_alive_ms")
    )
    old = old.join(F.broadcast(alive), old.node == alive.a_node, "left")
    sender_alive = F.when(
        F.col("last_alive_ms").isNull(),
        F.lit("; the sender has no lease row (stopped cleanly, or not started)"),
    ).otherwise(
        F.concat(
            F.lit("; the sender was last alive at "),
            F.date_format(F.timestamp_millis(F.col("last_alive_ms")), "yyyy-MM-dd HH:mm:ss'Z'"),
            F.when(
                F.col("last_alive_ms") <= F.col("created_at") + grace_ms,
                F.lit(" (down since it wrote the row: sent again at its next start)"),
            ).otherwise(F.lit("")),
        )
    )
    # the flow that sent each old row (ours: the initiating flow its session names, or the
    # responder the target started) and when it ended, if it has (few rows: old ones only)
    session = message_session(F.col("message_id"))
    old = old.withColumn(
        "sending_flow",
        F.when(
            is_responder(session),
            responder_flow_id(F.col("target"), initiator_session(session)),
        ).otherwise(session_flow(session)),
    )
    # (the candidates' results and exceptions hold it: an old row makes its conversation a
    # candidate, and the flow owning each candidate end is among the flows kept)
    ended = snapshot.results.select("node", "flow_id", F.col("completed_at").alias("ended_at"))
    ended = ended.unionByName(
        snapshot.exceptions.select("node", "flow_id", F.col("failed_at").alias("ended_at"))
    )
    senders = old.select(F.col("node").alias("s_node"), F.col("sending_flow").alias("s_flow"))
    ended = (
        ended.join(
            senders, (ended.node == senders.s_node) & (ended.flow_id == senders.s_flow), "left_semi"
        )
        .groupBy(F.col("node").alias("e_node"), F.col("flow_id").alias("e_flow"))
        .agg(F.min("ended_at").alias("flow_ended_at"))
    )
    old = old.join(
        ended, (ended.e_node == old.node) & (ended.e_flow == old.sending_flow), "left"
    ).drop("e_node", "e_flow")
    ended_at = F.date_format(F.timestamp_millis(F.col("flow_ended_at")), "yyyy-MM-dd HH:mm:ss'Z'")
    # a flow's messages are written in its own transactions, its last ones with its end:
    # a row written after its flow ended (beyond the grace, for clocks) no flow wrote
    after_end = F.coalesce(F.col("created_at") > F.col("flow_ended_at") + grace_ms, F.lit(False))
    analyzed = is_analyzed(snapshot, F.col("target"))
    written_after = F.concat(
        F.lit("in the outbox since "),
        F.date_format(F.timestamp_millis(F.col("created_at")), "yyyy-MM-dd HH:mm:ss'Z'"),
        F.lit(", but its flow "),
        F.col("sending_flow"),
        F.lit(" had ended at "),
        ended_at,
        F.lit(": no flow of this node wrote it (forged, or put back from another database)"),
    )
    waiting = F.concat(
        F.lit("in the outbox for "),
        ((F.lit(as_of) - F.col("created_at")) / 1000).cast("bigint").cast("string"),
        F.lit(" s; "),
        F.when(~analyzed, F.concat(F.col("target"), F.lit(" not analyzed")))
        .when(
            F.col("delivered"),
            F.concat(
                F.lit("already consumed by "),
                F.col("target"),
                F.lit(": the row was left behind"),
            ),
        )
        .otherwise(F.concat(F.lit("not consumed by "), F.col("target"))),
        F.when(
            F.col("flow_ended_at").isNotNull(),
            F.concat(F.lit("; its flow "), F.col("sending_flow"), F.lit(" ended at "), ended_at),
        ).otherwise(F.lit("")),
        sender_alive,
    )
    # one pass over the old rows, each of one kind or the other
    return _findings(
        old,
        F.when(after_end, "written_after_end").otherwise("undelivered"),
        session_id=session,
        sequence=message_sequence(F.col("message_id")),
        counterparty=F.col("target"),
        message_ids=F.col("message_id"),
        at=F.col("created_at"),
        detail=F.when(after_end, written_after).otherwise(waiting),
    )


def _sequence_gaps(snapshot: Snapshot, by_session: DataFrame, judged_before: int) -> DataFrame:
    """Sequence numbers never consumed below the highest one consumed in a session.

    A session (node, session, sender) has a gap when its highest sequence number + 1 is more
    than the distinct numbers it consumed; grouped on the shuffle by session the records
    already had, each number missing below the highest is a finding, unless the sender's
    outbox still holds that message (not judged within the grace either).
    """
    from pyspark.sql import functions as F

    sessions = (
        by_session.where(F.col("sequence") >= 0)  # a number below 0 is a bad_sequence
        .groupBy("node", "session_id", "sender")
        .agg(
            F.max("sequence").alias("top"),
            F.collect_set("sequence").alias("sequences"),
            F.max("inserted_at").alias("at"),
        )
        .where((F.col("top") >= F.size("sequences")) & (F.col("at") <= judged_before))
    )
    # the first GAPS_LISTED missing numbers all lie below size + GAPS_LISTED: a corrupt
    # number near 2**63 lists that many, not billions (nor overflows)
    last = F.least(F.col("top"), F.size("sequences").cast("bigint") + GAPS_LISTED - 1)
    absent = F.array_except(F.sequence(F.lit(0).cast("bigint"), last), F.col("sequences"))
    missing = sessions.select(
        "node",
        "session_id",
        "sender",
        "at",
        (F.col("top") - F.size("sequences") + 1).alias("missing_count"),
        F.explode(F.slice(absent, 1, GAPS_LISTED)).alias("sequence"),
    )
    missing = missing.withColumn(
        "missing_id", expected_message_id(peer_session(F.col("session_id")), F.col("sequence"))
    )
    queued = snapshot.outbox.select(
        F.col("node").alias("q_node"), F.col("message_id").alias("q_id")
    )
    missing = missing.join(
        queued, (queued.q_node == missing.sender) & (queued.q_id == missing.missing_id), "left_anti"
    )
    return _findings(
        missing,
        "sequence_gap",
        counterparty=F.col("sender"),
        message_ids=F.col("missing_id"),
        detail=F.concat(
            F.lit("message "),
            F.col("sequence").cast("string"),
            F.lit(" never consumed, later ones were"),
            F.when(
                F.col("missing_count") > GAPS_LISTED,
                F.concat(
                    F.lit(" ("),
                    F.col("missing_count").cast("string"),
                    F.lit(f" missing in the session; the first {GAPS_LISTED} are listed)"),
                ),
            ).otherwise(F.lit("")),
        ),
    )


def _bad_sequences(snapshot: Snapshot) -> DataFrame:
    """Records of a sequence number below 0: no sender numbers a message so."""
    from pyspark.sql import functions as F

    return _findings(
        snapshot.message_ids.where(F.col("sequence") < 0),
        "bad_sequence",
        counterparty=F.col("sender"),
        message_ids=F.col("message_id"),
        at=F.col("inserted_at"),
        detail=F.lit("sequence number below 0: no sender numbers a message so"),
    )


def _findings(
    frame: DataFrame,
    kind: str | Column,
    *,
    message_ids: Column,
    detail: Column,
    session_id: Column | None = None,
    sequence: Column | None = None,
    counterparty: Column | None = None,
    at: Column | None = None,
) -> DataFrame:
    """``frame``'s rows as audit findings of ``kind``, in the columns every kind has.

    ``kind``: a name, or a column giving each row's. The kinds are united by name into one
    frame, so this is the one place their columns are named: ``node``, ``kind``,
    ``session_id``, ``sequence``, ``counterparty``, ``message_ids``, ``at`` and ``detail``.
    A column not given is ``frame``'s own of that name.
    """
    from pyspark.sql import functions as F

    def own(column: Column | None, name: str) -> Column:
        return (F.col(name) if column is None else column).alias(name)

    return frame.select(
        "node",
        (F.lit(kind) if isinstance(kind, str) else kind).alias("kind"),
        own(session_id, "session_id"),
        own(sequence, "sequence"),
        own(counterparty, "counterparty"),
        message_ids.alias("message_ids"),
        own(at, "at"),
        detail.alias("detail"),
    )
