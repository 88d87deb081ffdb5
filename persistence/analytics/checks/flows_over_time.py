"""The ``flows_over_time`` check (``info``): flows per status over time."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from persistence.analytics.check_results import (
    DAY_MS,
    HOUR_MS,
    INFO,
    MINUTE_MS,
    CheckResult,
    CheckSettings,
    Verdict,
    duration,
    keep_in_order,
    take_first_rows,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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
MAX_BUCKETS = 48
"""The most buckets :func:`choose_bucket` cuts the status-over-time series into."""


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
    one = F.lit(1).cast("bigint").alias("n")
    events = (
        snapshot.checkpoints.select(F.col("updated_at").alias("at"), "status", one)
        .unionByName(
            snapshot.results.select(
                F.col("completed_at").alias("at"), F.lit("COMPLETED").alias("status"), one
            )
        )
        .unionByName(
            snapshot.exceptions.select(
                F.col("failed_at").alias("at"), F.lit("FAILED").alias("status"), one
            )
        )
    )

    def span() -> tuple[int | None, int | None]:
        found = events.agg(F.min("at").alias("low"), F.max("at").alias("high")).first()
        return (found["low"], found["high"]) if found is not None else (None, None)

    # seen by flow_counts as its rows went by, when it ran first; else read here
    earliest, latest = snapshot.shared_value(("event span",), span)
    low, high = int(earliest or 0), int(latest or 0)
    bucket = settings.bucket_ms or choose_bucket(high - low)
    # flow_counts' events per hour (when it ran first) hold the series of whole-hour buckets
    # (floor(floor(at / hour) * hour / bucket) = floor(at / bucket) when the bucket is whole
    # hours): summed up from those few rows instead of a pass over every flow
    hourly: DataFrame | None = snapshot.shared_value(("events by hour",), lambda: None)
    if hourly is not None and bucket % HOUR_MS == 0:
        events = hourly.select(
            (F.col("hour") * HOUR_MS).alias("at"), "status", F.col("flows").alias("n")
        )
    start = F.floor(F.col("at") / bucket) * bucket
    frame = (
        events.withColumn("bucket_start_ms", start.cast("bigint"))
        .groupBy("bucket_start_ms", "status")
        .agg(F.sum("n").alias("flows"))
        .withColumn(
            "bucket",
            F.date_format(F.timestamp_millis("bucket_start_ms"), "yyyy-MM-dd HH:mm:ss"),
        )
        .select("bucket", "bucket_start_ms", "status", "flows", F.lit(bucket).alias("bucket_ms"))
    )
    frame = keep_in_order(snapshot, frame, "bucket_start_ms", "status")
    first = take_first_rows(frame, settings.report_rows)
    if first.complete:
        buckets = len({row["bucket_start_ms"] for row in first.rows})
    else:
        buckets = frame.select("bucket_start_ms").distinct().count()
    summary = f"{buckets} bucket{'s' if buckets != 1 else ''} of {duration(bucket)}"
    return CheckResult(
        "flows_over_time",
        "Flows per status over time",
        frame,
        Verdict(INFO, summary),
        extras={},
        first=first,
    )
