"""The exactly-once audit of the dedup ids and the outbox (``fail``).

Each consumed message is recorded (``node_message_ids``) with its deterministic id, its
session and its sequence number, in the transaction that consumed it; each sent one waits
in the outbox until the transport took it. The audit looks for what the primary key cannot
stop: a message consumed twice (under two ids, or where the key is gone), an id reused or
not of the grammar, a sequence number never consumed below later ones, and outbox rows left
behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from persistence.analytics.candidates import candidate_snapshot
from persistence.analytics.checking import (
    FAIL,
    OK,
    CheckResult,
    CheckSettings,
    Verdict,
    as_of_ms,
    count_with_first_rows,
    duration,
    is_analyzed,
    keep,
)
from persistence.analytics.session_columns import (
    expected_message_id,
    message_sequence,
    message_session,
    peer_session,
)

BROADCAST_ROWS = 200_000
"""Up to this many keys (pairs consumed twice, irregular ids, sessions that may have a gap),
the message ids are filtered by them through a broadcast (a scan, no shuffle); more use a
plain join."""

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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
      outbox);
    * ``undelivered``: an outbox message older than ``outbox_after_ms`` (the detail says
      whether the target already consumed it, i.e. only the row was left behind).

    ``fail`` when any is found. Only the screening's candidate conversations can have a
    finding (:mod:`persistence.analytics.screening`): the rules run on the snapshot restricted
    to them (:func:`audit_records`).
    """
    settings = settings or CheckSettings()
    return audit_records(candidate_snapshot(snapshot, settings), settings)


def audit_records(snapshot: Snapshot, settings: CheckSettings) -> CheckResult:
    """The audit's full rules on ``snapshot`` (a reused id is looked for in every record)."""
    from pyspark.sql import functions as F

    whole = snapshot.whole
    as_of = as_of_ms(snapshot, settings)
    ids = snapshot.message_ids
    # one shuffle by session serves both groupings by session (consumed twice, and the gaps);
    # each counts first (a code-generated hash aggregation) and gathers the ids and sequence
    # numbers only for the few groups that are findings or may be
    by_session = ids.repartition("node", "session_id")
    repeated = keep(
        snapshot,
        by_session.groupBy("node", "session_id", "sequence")
        .agg(F.count("*").alias("times"))
        .where(F.col("times") > 1)
        .select(F.col("node").alias("r_node"), F.col("session_id").alias("r_session"), "sequence"),
    )
    few = _narrow(repeated)
    twice_rows = ids.join(
        few(repeated),
        (ids.node == repeated.r_node)
        & ids.session_id.eqNullSafe(repeated.r_session)
        & ids.sequence.eqNullSafe(repeated.sequence),
        "left_semi",
    )
    twice = (
        twice_rows.groupBy("node", "session_id", "sequence")
        .agg(
            F.count("*").alias("times"),
            F.sort_array(F.collect_list("message_id")).alias("ids"),
            F.first("sender").alias("counterparty"),
            F.max("inserted_at").alias("at"),
        )
        .select(
            "node",
            F.lit("consumed_twice").alias("kind"),
            "session_id",
            "sequence",
            "counterparty",
            F.array_join("ids", " ").alias("message_ids"),
            "at",
            F.concat(
                F.lit("message "),
                F.col("sequence").cast("string"),
                F.lit(" consumed "),
                F.col("times").cast("string"),
                F.lit(" times"),
            ).alias("detail"),
        )
    )
    # an id recorded for two (session, sequence) pairs: a row whose id is the one its pair
    # gives (N-<peer session>-<sequence>, sequence >= 0) shares its id only with rows of the
    # same pair, since the id spells the pair out; so only ids of other rows can be reused
    expected = expected_message_id(peer_session(F.col("session_id")), F.col("sequence"))
    regular = F.coalesce((F.col("message_id") == expected) & (F.col("sequence") >= 0), F.lit(False))
    irregular = keep(
        snapshot,
        ids.where(~regular)
        .select(F.col("node").alias("d_node"), F.col("message_id").alias("d_id"))
        .distinct(),
    )
    # an irregular id is among the candidates; the row it may share its id with need not be
    narrow = _narrow(irregular)
    every = whole.message_ids if irregular.count() else ids
    suspects = every.join(
        narrow(irregular),
        (every.node == irregular.d_node) & (every.message_id == irregular.d_id),
        "left_semi",
    )
    reused = (
        suspects.groupBy("node", "message_id")
        .agg(
            F.countDistinct("session_id", "sequence").alias("pairs"),
            F.first("session_id").alias("session_id"),
            F.first("sender").alias("counterparty"),
            F.max("inserted_at").alias("at"),
        )
        .where(F.col("pairs") > 1)
        .select(
            "node",
            F.lit("id_reused").alias("kind"),
            "session_id",
            F.lit(None).cast("bigint").alias("sequence"),
            "counterparty",
            F.col("message_id").alias("message_ids"),
            "at",
            F.concat(
                F.lit("id recorded for "), F.col("pairs").cast("string"), F.lit(" messages")
            ).alias("detail"),
        )
    )
    mismatch = ids.where(F.col("message_id") != expected).select(
        "node",
        F.lit("id_mismatch").alias("kind"),
        "session_id",
        "sequence",
        F.col("sender").alias("counterparty"),
        F.col("message_id").alias("message_ids"),
        F.col("inserted_at").alias("at"),
        F.concat(F.lit("expected "), expected).alias("detail"),
    )
    gaps = _sequence_gaps(snapshot, by_session, repeated, as_of - settings.grace_ms)
    old = snapshot.outbox.where(F.col("created_at") <= as_of - settings.outbox_after_ms)
    wanted = F.broadcast(
        old.select(F.col("target").alias("w_node"), F.col("message_id").alias("w_id"))
    )
    targets = (
        ids.join(wanted, (ids.node == wanted.w_node) & (ids.message_id == wanted.w_id), "left_semi")
        .select(F.col("node").alias("t_node"), F.col("message_id").alias("t_id"))
        .distinct()
        .withColumn("delivered", F.lit(True))
    )
    old = old.join(
        targets, (targets.t_node == old.target) & (targets.t_id == old.message_id), "left"
    )
    analyzed = is_analyzed(snapshot, F.col("target"))
    undelivered = old.select(
        "node",
        F.lit("undelivered").alias("kind"),
        message_session(F.col("message_id")).alias("session_id"),
        message_sequence(F.col("message_id")).alias("sequence"),
        F.col("target").alias("counterparty"),
        F.col("message_id").alias("message_ids"),
        F.col("created_at").alias("at"),
        F.concat(
            F.lit("in the outbox for "),
            ((F.lit(as_of) - F.col("created_at")) / 1000).cast("bigint").cast("string"),
            F.lit(" s; "),
            F.when(~analyzed, F.concat(F.col("target"), F.lit(" not analyzed")))
            .when(
                F.col("delivered").isNotNull(),
                F.concat(
                    F.lit("already consumed by "),
                    F.col("target"),
                    F.lit(": the row was left behind"),
                ),
            )
            .otherwise(F.concat(F.lit("not consumed by "), F.col("target"))),
        ).alias("detail"),
    )
    frame = (
        twice.unionByName(reused).unionByName(mismatch).unionByName(gaps).unionByName(undelivered)
    )
    frame = keep(snapshot, frame.orderBy("kind", "node", "session_id", "sequence"))
    counts, first = count_with_first_rows(frame, "kind", settings.report_rows)
    found = sum(counts.values())
    if found:
        parts = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
        verdict = Verdict(
            FAIL, f"{found} exactly-once finding{'s' if found != 1 else ''}: {parts}", found
        )
    else:
        verdict = Verdict(
            OK,
            "no message consumed twice, no malformed id, no sequence gap, no outbox message "
            f"older than {duration(settings.outbox_after_ms)}",
        )
    return CheckResult("exactly_once_audit", "Exactly-once audit", frame, verdict, first=first)


def _sequence_gaps(
    snapshot: Snapshot, by_session: DataFrame, repeated: DataFrame, judged_before: int
) -> DataFrame:
    """Sequence numbers never consumed below the highest one consumed in a session.

    A session (node, session, sender) has a gap when its highest sequence number + 1 is more
    than the distinct numbers it consumed. Counting rows instead of distinct numbers gives
    the same answer where no number was consumed twice (``repeated``: few), so the distinct
    numbers are gathered only for sessions that fail the count or have a number twice.
    """
    from pyspark.sql import functions as F

    counted = by_session.groupBy("node", "session_id", "sender").agg(
        F.max("sequence").alias("top"),
        F.count("*").alias("rows"),
        F.max("inserted_at").alias("at"),
    )
    twice = repeated.select(
        F.col("r_node").alias("t_node"), F.col("r_session").alias("t_session")
    ).distinct()
    counted = counted.join(
        F.broadcast(twice.withColumn("twice", F.lit(True))),
        (counted.node == twice.t_node) & counted.session_id.eqNullSafe(twice.t_session),
        "left",
    )
    candidates = keep(
        snapshot,
        counted.where(
            ((F.col("top") + 1 > F.col("rows")) | F.col("twice").isNotNull())
            & (F.col("at") <= judged_before)
        ).select(
            F.col("node").alias("c_node"),
            F.col("session_id").alias("c_session"),
            F.col("sender").alias("c_sender"),
        ),
    )
    rows = by_session.join(
        _narrow(candidates)(candidates),
        (by_session.node == candidates.c_node)
        & by_session.session_id.eqNullSafe(candidates.c_session)
        & by_session.sender.eqNullSafe(candidates.c_sender),
        "left_semi",
    )
    sessions = (
        rows.groupBy("node", "session_id", "sender")
        .agg(
            F.max("sequence").alias("top"),
            F.countDistinct("sequence").alias("seen"),
            F.collect_set("sequence").alias("sequences"),
            F.max("inserted_at").alias("at"),
        )
        .where((F.col("top") + 1 > F.col("seen")) & (F.col("at") <= judged_before))
    )
    missing = sessions.select(
        "node",
        "session_id",
        "sender",
        "at",
        "sequences",
        F.explode(F.sequence(F.lit(0).cast("bigint"), F.col("top"))).alias("sequence"),
    ).where(~F.array_contains(F.col("sequences"), F.col("sequence")))
    missing = missing.withColumn(
        "missing_id", expected_message_id(peer_session(F.col("session_id")), F.col("sequence"))
    )
    queued = snapshot.outbox.select(
        F.col("node").alias("q_node"), F.col("message_id").alias("q_id")
    )
    missing = missing.join(
        queued, (queued.q_node == missing.sender) & (queued.q_id == missing.missing_id), "left_anti"
    )
    return missing.select(
        "node",
        F.lit("sequence_gap").alias("kind"),
        "session_id",
        "sequence",
        F.col("sender").alias("counterparty"),
        F.col("missing_id").alias("message_ids"),
        "at",
        F.concat(
            F.lit("message "),
            F.col("sequence").cast("string"),
            F.lit(" never consumed, later ones were"),
        ).alias("detail"),
    )


def _narrow(frame: DataFrame) -> Callable[[DataFrame], DataFrame]:
    """Broadcast a (cached) frame of keys when it is small, else join it plainly."""
    from pyspark.sql import functions as F

    if frame.count() <= BROADCAST_ROWS:
        return F.broadcast
    return lambda keys: keys
