"""The inventory checks: what the nodes hold, and what it costs (``info``, or ``warn``).

* :func:`flow_counts`: flows by node, flow class and status;
* :func:`flows_over_time`: flows per status over time;
* :func:`checkpoint_costs`: checkpoint size and journal length by flow class;
* :func:`failed_flows`: hospitalized and failed flows with their errors (``warn`` when a
  flow is in the hospital).

Each reads one node table or a union of them, without joins across nodes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from persistence.analytics.checking import (
    DAY_MS,
    HOUR_MS,
    INFO,
    MINUTE_MS,
    WARN,
    CheckResult,
    CheckSettings,
    Verdict,
    duration,
    first_rows,
    keep,
)
from persistence.analytics.screening import screen
from persistence.analytics.session_flows import FLOW_KEY, flow_keys

if TYPE_CHECKING:
    from persistence.analytics.snapshot import Snapshot

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
"""The round buckets of the status-over-time series, smallest first."""
BROADCAST_ROWS = 200_000
"""Up to this many flows in more than one table, the flow counts leave them out through a
broadcast (a scan, no shuffle); more use plain joins."""
MAX_BUCKETS = 48
"""The most buckets :func:`choose_bucket` cuts the status-over-time series into."""


def flow_counts(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Flows by node, flow class and status.

    Live flows count by the status in their checkpoint row (``UNSTARTED``, ``RUNNABLE``,
    ``SUSPENDED``, ``HOSPITALIZED``); finished flows as ``COMPLETED`` (a row in
    ``node_flow_results``) or ``FAILED`` (``node_flow_exceptions``). Each flow counts once:
    one both finished and live (``node_integrity`` reports it) counts as finished, as the
    node itself treats it (it does not trust a checkpoint older than a stored outcome), and
    one with both a result and an error as ``COMPLETED``. Always ``info``.
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    found = screen(snapshot, settings)
    narrow = F.broadcast if found.overlap_count <= BROADCAST_ROWS else (lambda frame: frame)
    # the few flows in more than one table (the screening's overlaps) leave the counts of the
    # live ones (finished: counted as finished) and of the errors (also a result: completed)
    overlaps = found.overlaps
    finished = narrow(
        overlaps.where(F.col("live") & (F.col("finished") | F.col("failed"))).select(
            F.col("flow_key").alias("o_key")
        )
    )
    completed = narrow(
        overlaps.where(F.col("finished") & F.col("failed")).select(F.col("flow_key").alias("o_key"))
    )
    checkpoints, exceptions = snapshot.checkpoints, snapshot.exceptions
    if found.overlap_count:
        key = F.col(FLOW_KEY) == F.col("o_key")
        checkpoints = flow_keys(snapshot, checkpoints, "node", "flow_class", "status").join(
            finished, key, "left_anti"
        )
        exceptions = flow_keys(snapshot, exceptions, "node", "flow_class").join(
            completed, key, "left_anti"
        )
    live = checkpoints.select("node", "flow_class", "status")
    done = snapshot.results.select("node", "flow_class", F.lit("COMPLETED").alias("status"))
    failed = exceptions.select("node", "flow_class", F.lit("FAILED").alias("status"))
    frame = (
        live.unionByName(done)
        .unionByName(failed)
        .groupBy("node", "flow_class", "status")
        .agg(F.count("*").alias("flows"))
        .orderBy("node", "flow_class", "status")
    )
    frame = keep(snapshot, frame)
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
    frame = keep(snapshot, frame)
    buckets = frame.select("bucket_start_ms").distinct().count()
    summary = f"{buckets} bucket{'s' if buckets != 1 else ''} of {duration(bucket)}"
    return CheckResult(
        "flows_over_time",
        "Flows per status over time",
        frame,
        Verdict(INFO, summary),
        extras={},
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
    frame = keep(snapshot, frame)
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
    offenders = keep(snapshot, offenders.orderBy("ranked_by", "rank"))
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
    histogram = keep(snapshot, histogram)
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
    frame = keep(snapshot, frame)
    # the first of them by node and flow (a top-N, no sort of every row); the count is exact
    settings = settings or CheckSettings()
    listed = keep(
        snapshot,
        first_rows(
            kept.select("node", "flow_id", "flow_class", "error_message", "updated_at"),
            ["node", "flow_id"],
            settings.report_rows,
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
        extra_totals={"hospitalized": kept_count},
    )
