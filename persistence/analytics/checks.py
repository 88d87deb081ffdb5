"""The checks: each a function of a :class:`Snapshot` that returns a DataFrame and a verdict.

Every check is documented in ``docs/analytics.md`` with what it reads and why a finding
matters. Time-based rules compare the tables' millisecond timestamps with
``CheckSettings.as_of_ms`` (default: the snapshot time), so a snapshot of yesterday can be
judged as of yesterday.

What a session looks like in the tables (``statemachine/session_messages.py``): flow ``F``
opens sessions ``F.s0``, ``F.s1``... (possibly with the initiating node's identity tag in
front, ``<tag>-F.s0``); the responder's side of ``F.s0`` is ``F.s0.r`` and its flow id is a
UUID5 of ``"<initiator node>|F.s0"`` (``statemachine.manager``). Message ``k``
sent from session ``S`` has id ``N-S-k``. A node's tables show a session when a flow waits
on it (``waiting_for``), when a message of it was consumed (``node_message_ids``: our
session, the sender, the sequence number) or when a message for it waits in the outbox.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from statemachine.session_ids import RESPONDER_NAMESPACE

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.loading import Snapshot

OK = "ok"
INFO = "info"
WARN = "warn"
FAIL = "fail"
STATUS_ORDER = {OK: 0, INFO: 1, WARN: 2, FAIL: 3}
"""Verdict statuses, mildest first. Only ``fail`` makes ``fiberflow analyze`` exit non-zero."""

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
NICE_BUCKETS_MS = (
    1_000,
    5_000,
    15_000,
    MINUTE_MS,
    5 * MINUTE_MS,
    15 * MINUTE_MS,
    HOUR_MS,
    3 * HOUR_MS,
    6 * HOUR_MS,
    12 * HOUR_MS,
    DAY_MS,
    7 * DAY_MS,
)
MAX_BUCKETS = 48


@attrs.frozen
class Verdict:
    """What a check concluded: ``ok``, ``info``, ``warn`` or ``fail``, and why."""

    status: str
    summary: str
    findings: int = 0
    """Rows of the check's DataFrame that are findings (problems or items to look at)."""


@attrs.frozen
class CheckSettings:
    """Thresholds of the checks (milliseconds)."""

    as_of_ms: int | None = None
    """"Now" for the time-based rules; None: the snapshot time."""
    stuck_after_ms: int = 10 * MINUTE_MS
    """A flow suspended on a receive (or past its wake-up time) for longer is stuck."""
    outbox_after_ms: int = 5 * MINUTE_MS
    """An outbox message older than this is listed as undelivered."""
    grace_ms: int = MINUTE_MS
    """Evidence newer than this (before ``as_of``) is not judged by the cross-node rules:
    its messages may still be in the transport, or the snapshots of two nodes may straddle
    it."""
    top: int = 10
    """How many top offenders the checkpoint cost check lists."""
    bucket_ms: int | None = None
    """Bucket of the status-over-time series; None: chosen to give at most 48 buckets."""


@attrs.frozen
class CheckResult:
    """A check's outcome: its findings as a DataFrame, a verdict and supporting frames."""

    name: str
    title: str
    frame: DataFrame
    verdict: Verdict
    extras: dict[str, DataFrame] = attrs.field(factory=dict)


# --- column helpers -----------------------------------------------------------------------


def initiator_session(session: Column) -> Column:
    """The initiator's id of a session (``X.r`` -> ``X``; ``X`` stays)."""
    from pyspark.sql import functions as F

    return F.regexp_replace(session, r"\.r$", "")


def peer_session(session: Column) -> Column:
    """The other end's session id (``X`` <-> ``X.r``)."""
    from pyspark.sql import functions as F

    return F.when(session.endswith(".r"), initiator_session(session)).otherwise(
        F.concat(session, F.lit(".r"))
    )


SESSION_FLOW_PATTERN = r"^(?:[0-9a-f]{16}-)?(.+)\.s[0-9]+$"
"""An initiator session id: an optional 16-hex-digit identity tag of the initiating node and
a dash, the initiating flow's id, ``.s`` and the session's index (both the older ``F.s0`` and
the tagged ``<tag>-F.s0`` forms, as ``statemachine.session_messages.flow_id_of_session``)."""


def session_flow(session: Column) -> Column:
    """The id of the initiating flow of a session (``F.s3``, ``F.s3.r``, ``T-F.s3`` -> ``F``)."""
    from pyspark.sql import functions as F

    return F.regexp_extract(initiator_session(session), SESSION_FLOW_PATTERN, 1)


def responder_flow_id(initiator_node: Column, session: Column) -> Column:
    """The responder flow's id on the peer: UUID5 of ``"<initiator node>|<session>"``.

    Computed in Spark SQL (SHA-1 of namespace and name, version and variant bits set), the
    same id ``statemachine.manager`` gives the responder it starts.
    """
    from pyspark.sql import functions as F

    name = F.concat(initiator_node, F.lit("|"), session)
    digest = F.sha1(F.concat(F.unhex(F.lit(RESPONDER_NAMESPACE.hex)), F.encode(name, "UTF-8")))
    variant_nibble = F.conv(F.substring(digest, 17, 1), 16, 10).cast("int")
    variant = F.lower(F.hex(variant_nibble.bitwiseAND(3).bitwiseOR(8)))
    return F.concat(
        F.substring(digest, 1, 12),
        F.lit("5"),
        F.substring(digest, 14, 3),
        variant,
        F.substring(digest, 18, 15),
    )


def counterpart_flow(node: Column, session: Column) -> Column:
    """The flow that holds the other end of ``session`` (seen on ``node``), on the peer."""
    return _when_responder(session, session_flow(session), responder_flow_id(node, session))


def _when_responder(session: Column, responder_value: Column, initiator_value: Column) -> Column:
    from pyspark.sql import functions as F

    return F.when(session.endswith(".r"), responder_value).otherwise(initiator_value)


def expected_message_id(sender_session: Column, sequence: Column) -> Column:
    """``N-<sender session>-<sequence>``."""
    from pyspark.sql import functions as F

    return F.concat(F.lit("N-"), sender_session, F.lit("-"), sequence.cast("string"))


def waits(checkpoints: DataFrame) -> DataFrame:
    """One row per (flow, session it waits on) of flows suspended on ``Receive``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType, StructField, StructType

    schema = ArrayType(
        StructType(
            [StructField("session", StringType()), StructField("counterparty", StringType())]
        )
    )
    receiving = checkpoints.where(F.col("suspended_on") == "Receive")
    parsed = receiving.withColumn("wait", F.explode(F.from_json("waiting_for", schema)))
    return parsed.select(
        "*",
        F.col("wait.session").alias("session_id"),
        F.col("wait.counterparty").alias("counterparty"),
    ).drop("wait")


def known_flows(snapshot: Snapshot) -> DataFrame:
    """Every flow a node knows: live (its checkpoint status), ``COMPLETED`` or ``FAILED``."""
    from pyspark.sql import functions as F

    live = snapshot.checkpoints.select(
        "node", "flow_id", "status", "suspended_on", F.lit(0).alias("rank")
    )
    done = snapshot.results.select(
        "node",
        "flow_id",
        F.lit("COMPLETED").alias("status"),
        F.lit(None).cast("string").alias("suspended_on"),
        F.lit(1).alias("rank"),
    )
    failed = snapshot.exceptions.select(
        "node",
        "flow_id",
        F.lit("FAILED").alias("status"),
        F.lit(None).cast("string").alias("suspended_on"),
        F.lit(2).alias("rank"),
    )
    union = live.unionByName(done).unionByName(failed)
    best = union.groupBy("node", "flow_id").agg(
        F.min(F.struct("rank", "status", "suspended_on")).alias("best")
    )
    return best.select("node", "flow_id", F.col("best.status").alias("status"), "best.suspended_on")


def _as_of(snapshot: Snapshot, settings: CheckSettings) -> int:
    return settings.as_of_ms if settings.as_of_ms is not None else snapshot.taken_at_ms


def _nodes(snapshot: Snapshot) -> Column:
    from pyspark.sql import functions as F

    return F.array(*[F.lit(name) for name in snapshot.node_names])


def _keep(snapshot: Snapshot, frame: DataFrame) -> DataFrame:
    """Cache a check's (small) result frame until the snapshot closes."""
    cached = frame.cache()
    snapshot.on_close(cached.unpersist)
    return cached


def duration(ms: int) -> str:
    """A duration for people: ``90s``, ``10m``, ``2h30m``, ``3d``."""
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:g}s"
    minutes = seconds / 60
    if minutes < 120:
        return f"{minutes:.0f}m"
    hours, rest = divmod(round(minutes), 60)
    if hours < 48:
        return f"{hours}h{rest:02d}m" if rest else f"{hours}h"
    return f"{hours / 24:.1f}d"


# --- the checks -----------------------------------------------------------------------------


def flow_counts(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Flows by node, flow class and status.

    Live flows count by the status in their checkpoint row (``UNSTARTED``, ``RUNNABLE``,
    ``SUSPENDED``, ``HOSPITALIZED``); finished flows as ``COMPLETED`` (a row in
    ``node_flow_results``) or ``FAILED`` (``node_flow_exceptions``). Always ``info``.
    """
    from pyspark.sql import functions as F

    live = snapshot.checkpoints.select("node", "flow_class", "status")
    done = snapshot.results.select("node", "flow_class", F.lit("COMPLETED").alias("status"))
    failed = snapshot.exceptions.select("node", "flow_class", F.lit("FAILED").alias("status"))
    frame = (
        live.unionByName(done)
        .unionByName(failed)
        .groupBy("node", "flow_class", "status")
        .agg(F.count("*").alias("flows"))
        .orderBy("node", "flow_class", "status")
    )
    frame = _keep(snapshot, frame)
    totals = {
        row["status"]: row["flows"]
        for row in frame.groupBy("status").agg(F.sum("flows").alias("flows")).collect()
    }
    total = sum(totals.values())
    parts = ", ".join(f"{count} {status}" for status, count in sorted(totals.items()))
    summary = f"{total} flows on {len(snapshot.nodes)} nodes" + (f": {parts}" if parts else "")
    return CheckResult(
        "flow_counts", "Flows by node, class and status", frame, Verdict(INFO, summary)
    )


def choose_bucket(span_ms: int) -> int:
    """The smallest round bucket that cuts ``span_ms`` into at most 48 buckets."""
    for bucket in NICE_BUCKETS_MS:
        if span_ms / bucket <= MAX_BUCKETS:
            return bucket
    return math.ceil(span_ms / MAX_BUCKETS / DAY_MS) * DAY_MS


def flows_over_time(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Flows per status over time.

    Each flow counts once, in the bucket of its latest event: finished flows at
    ``completed_at``/``failed_at``, live flows at their latest checkpoint (``updated_at``) with
    the status it recorded. Always ``info``.
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    events = (
        snapshot.checkpoints.select(F.col("updated_at").alias("at"), "status")
        .unionByName(
            snapshot.results.select(
                F.col("completed_at").alias("at"), F.lit("COMPLETED").alias("status")
            )
        )
        .unionByName(
            snapshot.exceptions.select(
                F.col("failed_at").alias("at"), F.lit("FAILED").alias("status")
            )
        )
    )
    bounds = events.agg(F.min("at").alias("low"), F.max("at").alias("high")).first()
    low = int(bounds["low"]) if bounds is not None and bounds["low"] is not None else 0
    high = int(bounds["high"]) if bounds is not None and bounds["high"] is not None else 0
    bucket = settings.bucket_ms or choose_bucket(high - low)
    start = F.floor(F.col("at") / bucket) * bucket
    frame = (
        events.withColumn("bucket_start_ms", start.cast("bigint"))
        .groupBy("bucket_start_ms", "status")
        .agg(F.count("*").alias("flows"))
        .withColumn(
            "bucket",
            F.date_format(F.timestamp_millis("bucket_start_ms"), "yyyy-MM-dd HH:mm:ss"),
        )
        .select("bucket", "bucket_start_ms", "status", "flows", F.lit(bucket).alias("bucket_ms"))
        .orderBy("bucket_start_ms", "status")
    )
    frame = _keep(snapshot, frame)
    buckets = frame.select("bucket_start_ms").distinct().count()
    summary = f"{buckets} bucket{'s' if buckets != 1 else ''} of {duration(bucket)}"
    return CheckResult(
        "flows_over_time",
        "Flows per status over time",
        frame,
        Verdict(INFO, summary),
        extras={},
    )


def stuck_flows(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Flows suspended longer than ``stuck_after_ms``, with what they wait for.

    * suspended on ``Receive`` with the checkpoint older than the threshold: one row per
      session waited on, with the counterparty, the flow that should hold the other end
      (``counterpart_flow_id``), its status there (``COMPLETED``, ``SUSPENDED``, ...,
      ``missing``, or ``not analyzed`` when the counterparty's database was not given) and
      ``counterparty_has_session`` (its flow is live);
    * suspended on ``Sleep`` whose wake-up time passed more than the threshold ago;
    * ``UNSTARTED`` or ``RUNNABLE`` with no checkpoint for longer than the threshold (its
      node is not running it).

    Flows in the hospital are left to :func:`failed_flows`; flows an operator paused
    (``node_paused_flows``) are not judged but listed in ``extras["paused"]``. ``warn`` when
    any is found.
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    as_of = _as_of(snapshot, settings)
    limit = as_of - settings.stuck_after_ms
    paused = snapshot.paused.select(
        F.col("node").alias("p_node"), F.col("flow_id").alias("p_flow"), "paused_at"
    )
    live = snapshot.checkpoints
    on_hold = (live.node == paused.p_node) & (live.flow_id == paused.p_flow)
    checkpoints = live.where(F.col("status") != "HOSPITALIZED").join(paused, on_hold, "left_anti")
    held = _keep(
        snapshot,
        live.join(paused, on_hold)
        .select("node", "flow_id", "flow_class", "status", "suspended_on", "paused_at")
        .orderBy("node", "flow_id"),
    )
    receiving = waits(checkpoints).where(F.col("updated_at") <= limit)
    known = known_flows(snapshot).select(
        F.col("node").alias("k_node"),
        F.col("flow_id").alias("k_flow"),
        F.col("status").alias("counterpart_status"),
    )
    receiving = receiving.withColumn(
        "counterpart_flow_id", counterpart_flow(F.col("node"), F.col("session_id"))
    )
    receiving = receiving.join(
        known,
        (known.k_node == receiving.counterparty) & (known.k_flow == receiving.counterpart_flow_id),
        "left",
    )
    analyzed = F.array_contains(_nodes(snapshot), F.col("counterparty"))
    live_states = ("UNSTARTED", "RUNNABLE", "SUSPENDED", "HOSPITALIZED")
    receiving = receiving.select(
        "node",
        "flow_id",
        "flow_class",
        "status",
        "suspended_on",
        (F.lit(as_of) - F.col("updated_at")).alias("waited_ms"),
        "session_id",
        "counterparty",
        "counterpart_flow_id",
        F.when(~analyzed, F.lit("not analyzed"))
        .when(F.col("counterpart_status").isNull(), F.lit("missing"))
        .otherwise(F.col("counterpart_status"))
        .alias("counterpart_status"),
        F.when(~analyzed, F.lit(None).cast("boolean"))
        .otherwise(
            F.col("counterpart_status").isin(*live_states) & F.col("counterpart_status").isNotNull()
        )
        .alias("counterparty_has_session"),
    )
    until = F.get_json_object("waiting_for", "$.until").cast("bigint")
    sleeping = checkpoints.where((F.col("suspended_on") == "Sleep") & (until <= limit))
    idle = checkpoints.where(
        F.col("status").isin("UNSTARTED", "RUNNABLE") & (F.col("updated_at") <= limit)
    )
    others = sleeping.withColumn("waited_ms", F.lit(as_of) - until).unionByName(
        idle.withColumn("waited_ms", F.lit(as_of) - F.col("updated_at"))
    )
    others = others.select(
        "node",
        "flow_id",
        "flow_class",
        "status",
        "suspended_on",
        "waited_ms",
        *[
            F.lit(None).cast(kind).alias(name)
            for name, kind in (
                ("session_id", "string"),
                ("counterparty", "string"),
                ("counterpart_flow_id", "string"),
                ("counterpart_status", "string"),
                ("counterparty_has_session", "boolean"),
            )
        ],
    )
    frame = _keep(
        snapshot, receiving.unionByName(others).orderBy(F.desc("waited_ms"), "node", "flow_id")
    )
    flows = frame.select("node", "flow_id").distinct().count()
    threshold = duration(settings.stuck_after_ms)
    on_pause = held.count()
    aside = f" ({on_pause} paused by an operator, not judged)" if on_pause else ""
    if flows:
        verdict = Verdict(
            WARN,
            f"{flows} flow{'s' if flows != 1 else ''} stuck for more than {threshold}{aside}",
            frame.count(),
        )
    else:
        verdict = Verdict(OK, f"no flow suspended for more than {threshold}{aside}")
    return CheckResult("stuck_flows", "Stuck flows", frame, verdict, extras={"paused": held})


def session_ends(snapshot: Snapshot) -> DataFrame:
    """Every (node, session, counterparty) the tables show, with how and since when.

    ``evidence`` lists ``waiting`` (a live flow waits on it), ``received`` (a message of it
    was consumed) and ``outbox`` (a message for it waits in the outbox); ``since_ms`` is the
    earliest of those times.
    """
    from pyspark.sql import functions as F

    waiting = waits(snapshot.checkpoints).select(
        "node",
        "session_id",
        "counterparty",
        F.lit("waiting").alias("evidence"),
        F.col("updated_at").alias("at"),
    )
    received = snapshot.message_ids.select(
        "node",
        "session_id",
        F.col("sender").alias("counterparty"),
        F.lit("received").alias("evidence"),
        F.col("inserted_at").alias("at"),
    )
    sent = snapshot.outbox.select(
        "node",
        F.regexp_extract("message_id", r"^N-(.+)-[0-9]+$", 1).alias("session_id"),
        F.col("target").alias("counterparty"),
        F.lit("outbox").alias("evidence"),
        F.col("created_at").alias("at"),
    ).where(F.col("session_id") != "")
    return (
        waiting.unionByName(received)
        .unionByName(sent)
        .groupBy("node", "session_id", "counterparty")
        .agg(
            F.min("at").alias("since_ms"), F.sort_array(F.collect_set("evidence")).alias("evidence")
        )
    )


def session_consistency(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Cross-node session consistency: every session seen has its counterpart.

    For each session end a node's tables show (:func:`session_ends`) with a counterparty
    among the analyzed nodes, the flow holding the other end must be known there (live,
    completed or failed):

    * a responder end ``X.r`` needs the initiating flow (``X`` without ``.sN``);
    * an initiator end ``X`` needs the responder flow (UUID5 of ``"<node>|X"``), unless the
      peer consumed the initial message and our flow has ended (the peer refused the
      session), or the initial message still waits in our outbox (in flight).

    Ends whose earliest evidence is newer than ``grace_ms`` before ``as_of`` are not judged
    (messages may be in the transport). The frame lists the orphans with both node names;
    ``extras["summary"]`` counts every end by outcome. ``fail`` when any orphan is found.
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    as_of = _as_of(snapshot, settings)
    ends = session_ends(snapshot).withColumn(
        "role", F.when(F.col("session_id").endswith(".r"), "responder").otherwise("initiator")
    )
    ends = ends.withColumn(
        "counterpart_flow_id", counterpart_flow(F.col("node"), F.col("session_id"))
    )
    known = known_flows(snapshot).select(
        F.col("node").alias("k_node"),
        F.col("flow_id").alias("k_flow"),
        F.col("status").alias("counterpart_status"),
    )
    ends = ends.join(
        known,
        (known.k_node == ends.counterparty) & (known.k_flow == ends.counterpart_flow_id),
        "left",
    ).drop("k_node", "k_flow")
    own = snapshot.checkpoints.select(
        F.col("node").alias("o_node"),
        F.col("flow_id").alias("o_flow"),
        F.lit(True).alias("own_live"),
    )
    ends = ends.join(
        own, (own.o_node == ends.node) & (own.o_flow == session_flow(ends.session_id)), "left"
    ).drop("o_node", "o_flow")
    initial_id = expected_message_id(F.col("session_id"), F.lit(0))
    consumed = snapshot.message_ids.select(
        F.col("node").alias("c_node"),
        F.col("message_id").alias("c_id"),
        F.lit(True).alias("initial_consumed"),
    )
    ends = ends.join(
        consumed, (consumed.c_node == ends.counterparty) & (consumed.c_id == initial_id), "left"
    ).drop("c_node", "c_id")
    queued = snapshot.outbox.select(
        F.col("node").alias("q_node"),
        F.col("message_id").alias("q_id"),
        F.lit(True).alias("initial_queued"),
    )
    ends = (
        ends.join(queued, (queued.q_node == ends.node) & (queued.q_id == initial_id), "left")
        .drop("q_node", "q_id")
        .dropDuplicates(["node", "session_id", "counterparty"])
    )
    analyzed = F.array_contains(_nodes(snapshot), F.col("counterparty"))
    initiator = F.col("role") == "initiator"
    outcome = (
        F.when(~analyzed, "not analyzed")
        .when(F.col("counterpart_status").isNotNull(), "ok")
        .when(
            initiator & F.col("initial_consumed").isNotNull() & F.col("own_live").isNull(),
            "ok (refused)",
        )
        .when(initiator & F.col("initial_queued").isNotNull(), "in flight")
        .when(F.col("since_ms") > as_of - settings.grace_ms, "too recent")
        .otherwise("orphan")
    )
    ends = _keep(snapshot, ends.withColumn("outcome", outcome))
    orphans = (
        ends.where(F.col("outcome") == "orphan")
        .select(
            "node",
            "session_id",
            "role",
            "counterparty",
            "counterpart_flow_id",
            F.array_join("evidence", ",").alias("evidence"),
            "since_ms",
            F.concat(
                F.lit("no flow "),
                F.col("counterpart_flow_id"),
                F.lit(" on "),
                F.col("counterparty"),
                F.lit(" holds the other end"),
            ).alias("problem"),
        )
        .orderBy("node", "session_id")
    )
    orphans = _keep(snapshot, orphans)
    summary_frame = _keep(
        snapshot, ends.groupBy("outcome").agg(F.count("*").alias("sessions")).orderBy("outcome")
    )
    counts = {row["outcome"]: row["sessions"] for row in summary_frame.collect()}
    found = counts.get("orphan", 0)
    detail = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    if found:
        verdict = Verdict(
            FAIL,
            f"{found} session end{'s' if found != 1 else ''} without a counterpart ({detail})",
            found,
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

    ``fail`` when any is found.
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    as_of = _as_of(snapshot, settings)
    ids = snapshot.message_ids

    twice = (
        ids.groupBy("node", "session_id", "sequence")
        .agg(
            F.count("*").alias("times"),
            F.sort_array(F.collect_list("message_id")).alias("ids"),
            F.first("sender").alias("counterparty"),
            F.max("inserted_at").alias("at"),
        )
        .where(F.col("times") > 1)
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
    reused = (
        ids.groupBy("node", "message_id")
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
    expected = expected_message_id(peer_session(F.col("session_id")), F.col("sequence"))
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
    gaps = _sequence_gaps(snapshot, as_of - settings.grace_ms)
    targets = (
        ids.select(F.col("node").alias("t_node"), F.col("message_id").alias("t_id"))
        .distinct()
        .withColumn("delivered", F.lit(True))
    )
    old = snapshot.outbox.where(F.col("created_at") <= as_of - settings.outbox_after_ms)
    old = old.join(
        targets, (targets.t_node == old.target) & (targets.t_id == old.message_id), "left"
    )
    analyzed = F.array_contains(_nodes(snapshot), F.col("target"))
    undelivered = old.select(
        "node",
        F.lit("undelivered").alias("kind"),
        F.regexp_extract("message_id", r"^N-(.+)-[0-9]+$", 1).alias("session_id"),
        F.regexp_extract("message_id", r"-([0-9]+)$", 1).cast("bigint").alias("sequence"),
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
    frame = _keep(snapshot, frame.orderBy("kind", "node", "session_id", "sequence"))
    counts = {
        row["kind"]: row["n"]
        for row in frame.groupBy("kind").agg(F.count("*").alias("n")).collect()
    }
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
    return CheckResult("exactly_once_audit", "Exactly-once audit", frame, verdict)


def _sequence_gaps(snapshot: Snapshot, judged_before: int) -> DataFrame:
    from pyspark.sql import functions as F

    sessions = (
        snapshot.message_ids.groupBy("node", "session_id", "sender")
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


def checkpoint_costs(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Checkpoint size and journal length by flow class (the cost of a replay).

    The frame has, per flow class, the number of live checkpoints and the mean, median,
    90th and 99th percentile (approximate) and maximum of ``checkpoint_bytes`` and
    ``journal_length``, largest total first. ``extras["offenders"]`` holds the ``top``
    largest checkpoints and the ``top`` longest journals; ``extras["size_histogram"]`` the
    checkpoints per power-of-two size bucket. Always ``info``.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    cp = snapshot.checkpoints
    quantiles = F.lit([0.5, 0.9, 0.99])
    stats = cp.groupBy("flow_class").agg(
        F.count("*").alias("flows"),
        F.sum("checkpoint_bytes").alias("total_bytes"),
        F.round(F.avg("checkpoint_bytes"), 1).alias("mean_bytes"),
        F.percentile_approx("checkpoint_bytes", quantiles).alias("bytes_q"),
        F.max("checkpoint_bytes").alias("max_bytes"),
        F.round(F.avg("journal_length"), 1).alias("mean_journal"),
        F.percentile_approx("journal_length", quantiles).alias("journal_q"),
        F.max("journal_length").alias("max_journal"),
    )
    frame = stats.select(
        "flow_class",
        "flows",
        "total_bytes",
        "mean_bytes",
        F.col("bytes_q")[0].alias("p50_bytes"),
        F.col("bytes_q")[1].alias("p90_bytes"),
        F.col("bytes_q")[2].alias("p99_bytes"),
        "max_bytes",
        "mean_journal",
        F.col("journal_q")[0].alias("p50_journal"),
        F.col("journal_q")[1].alias("p90_journal"),
        F.col("journal_q")[2].alias("p99_journal"),
        "max_journal",
    ).orderBy(F.desc("total_bytes"), "flow_class")
    frame = _keep(snapshot, frame)
    columns = ["node", "flow_id", "flow_class", "status", "checkpoint_bytes", "journal_length"]
    by_size = Window.orderBy(F.desc("checkpoint_bytes"), "node", "flow_id")
    by_journal = Window.orderBy(F.desc("journal_length"), "node", "flow_id")
    biggest = cp.orderBy(F.desc("checkpoint_bytes"), "node", "flow_id").limit(settings.top)
    longest = cp.orderBy(F.desc("journal_length"), "node", "flow_id").limit(settings.top)
    offenders = biggest.select(
        F.lit("checkpoint_bytes").alias("ranked_by"),
        F.row_number().over(by_size).alias("rank"),
        *columns,
    ).unionByName(
        longest.select(
            F.lit("journal_length").alias("ranked_by"),
            F.row_number().over(by_journal).alias("rank"),
            *columns,
        )
    )
    offenders = _keep(snapshot, offenders.orderBy("ranked_by", "rank"))
    exponent = (
        F.when(F.col("checkpoint_bytes") > 0, F.floor(F.log2("checkpoint_bytes")))
        .otherwise(0)
        .cast("int")
    )
    histogram = (
        cp.select(exponent.alias("exponent"))
        .groupBy("exponent")
        .agg(F.count("*").alias("flows"))
        .select(
            F.pow(F.lit(2), "exponent").cast("bigint").alias("from_bytes"),
            F.pow(F.lit(2), F.col("exponent") + 1).cast("bigint").alias("to_bytes"),
            "flows",
        )
        .orderBy("from_bytes")
    )
    histogram = _keep(snapshot, histogram)
    total = cp.agg(
        F.count("*").alias("n"),
        F.sum("checkpoint_bytes").alias("b"),
        F.max("checkpoint_bytes").alias("m"),
    ).first()
    n = int(total["n"]) if total is not None else 0
    summary = f"{n} live checkpoints"
    if n and total is not None:
        summary += f", {int(total['b'])} bytes in all, the largest {int(total['m'])} bytes"
    return CheckResult(
        "checkpoint_costs",
        "Checkpoint size and journal length (replay cost)",
        frame,
        Verdict(INFO, summary),
        extras={"offenders": offenders, "size_histogram": histogram},
    )


def failed_flows(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Hospitalized and failed flows with their error summaries.

    The frame groups them by node, flow class and error: ``HOSPITALIZED`` flows (kept by
    the hospital, with the reason in ``error_message``) and failed flows (by ``error_kind``
    and ``exception_class``), with how many, the latest time and one message.
    ``extras["hospitalized"]`` lists the hospitalized flows one by one. ``warn`` when a flow
    is in the hospital (an operator must retry or kill it), else ``info``.
    """
    from pyspark.sql import functions as F

    kept = snapshot.checkpoints.where(F.col("status") == "HOSPITALIZED")
    hospitalized = kept.select(
        "node",
        "flow_class",
        F.lit("HOSPITALIZED").alias("outcome"),
        F.lit(None).cast("string").alias("exception_class"),
        F.coalesce(F.col("error_message"), F.lit("")).alias("message"),
        F.col("updated_at").alias("at"),
    )
    failed = snapshot.exceptions.select(
        "node",
        "flow_class",
        F.col("error_kind").alias("outcome"),
        "exception_class",
        "message",
        F.col("failed_at").alias("at"),
    )
    frame = (
        hospitalized.unionByName(failed)
        .groupBy("node", "flow_class", "outcome", "exception_class")
        .agg(
            F.count("*").alias("flows"),
            F.max("at").alias("latest_ms"),
            F.min("message").alias("example"),
        )
        .orderBy(F.desc("flows"), "node", "flow_class", "outcome")
    )
    frame = _keep(snapshot, frame)
    listed = _keep(
        snapshot,
        kept.select("node", "flow_id", "flow_class", "error_message", "updated_at").orderBy(
            "node", "flow_id"
        ),
    )
    counts = {
        row["h"]: row["n"]
        for row in frame.groupBy((F.col("outcome") == "HOSPITALIZED").alias("h"))
        .agg(F.sum("flows").alias("n"))
        .collect()
    }
    kept_count, failed_count = counts.get(True, 0), counts.get(False, 0)
    summary = f"{kept_count} in the hospital, {failed_count} failed"
    verdict = Verdict(WARN if kept_count else INFO, summary, kept_count + failed_count)
    return CheckResult(
        "failed_flows",
        "Hospitalized and failed flows",
        frame,
        verdict,
        extras={"hospitalized": listed},
    )


CheckFunction = Callable[["Snapshot", CheckSettings], CheckResult]

CHECKS: tuple[tuple[str, CheckFunction], ...] = (
    ("flow_counts", flow_counts),
    ("flows_over_time", flows_over_time),
    ("stuck_flows", stuck_flows),
    ("session_consistency", session_consistency),
    ("exactly_once_audit", exactly_once_audit),
    ("checkpoint_costs", checkpoint_costs),
    ("failed_flows", failed_flows),
)
"""Every check, in report order."""

CHECK_TITLES = {
    "flow_counts": "flows by node, class and status",
    "flows_over_time": "flows per status over time",
    "stuck_flows": "stuck flows",
    "session_consistency": "cross-node session consistency",
    "exactly_once_audit": "exactly-once audit",
    "checkpoint_costs": "checkpoint size and journal length",
    "failed_flows": "hospitalized and failed flows",
}
"""Short lower-case names for progress lines."""


def run_checks(
    snapshot: Snapshot,
    settings: CheckSettings | None = None,
    names: Sequence[str] | None = None,
    on_check: Callable[[int, int, str], None] | None = None,
) -> list[CheckResult]:
    """Run the checks (all, or those ``names``) in report order.

    ``on_check(index, total, name)`` is called before each (for a progress display).
    """
    settings = settings or CheckSettings()
    chosen = [(name, check) for name, check in CHECKS if names is None or name in names]
    unknown = set(names or ()) - {name for name, _ in CHECKS}
    if unknown:
        raise ValueError(f"unknown checks: {sorted(unknown)}")
    results = []
    for index, (name, check) in enumerate(chosen, start=1):
        if on_check is not None:
            on_check(index, len(chosen), name)
        results.append(check(snapshot, settings))
    return results


def worst(results: Sequence[CheckResult]) -> str:
    """The most serious verdict status among ``results`` (``ok`` when empty)."""
    return max((r.verdict.status for r in results), key=STATUS_ORDER.__getitem__, default=OK)
