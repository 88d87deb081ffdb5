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

from persistence.analytics.check_results import (
    DAY_MS,
    HOUR_MS,
    INFO,
    MINUTE_MS,
    WARN,
    CheckResult,
    CheckSettings,
    Verdict,
    count_with_first_rows,
    duration,
    first_rows,
    keep,
    keep_in_order,
    take_first_rows,
)
from persistence.analytics.screening import screen
from persistence.analytics.session_flows import FLOW_KEY, flow_keys

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

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

    def events(frame: DataFrame, status: Column, at: str, table: str) -> DataFrame:
        tagged: list[Column | str] = [
            "node",
            "flow_class",
            status.alias("status"),
            F.col(at).alias("at"),
            F.lit(table).alias("table"),
        ]
        if not found.overlap_count:
            return frame.select(*tagged)
        return flow_keys(snapshot, frame, *tagged)

    union = (
        events(snapshot.checkpoints, F.col("status"), "updated_at", "live")
        .unionByName(events(snapshot.results, F.lit("COMPLETED"), "completed_at", "completed"))
        .unionByName(events(snapshot.exceptions, F.lit("FAILED"), "failed_at", "failed"))
    )
    counted: Column = F.lit(True)
    if found.overlap_count:
        # the few flows in more than one table (the screening's overlaps) leave the counts of
        # the live ones (finished: counted as finished) and of the errors (also a result)
        overlaps = found.overlaps.select(
            F.col("flow_key").alias("o_key"),
            (F.col("live") & (F.col("finished") | F.col("failed"))).alias("o_live"),
            (F.col("finished") & F.col("failed")).alias("o_failed"),
        )
        narrow = F.broadcast if found.overlap_count <= BROADCAST_ROWS else (lambda frame: frame)
        union = union.join(narrow(overlaps), F.col(FLOW_KEY) == F.col("o_key"), "left")
        counted = ~(
            ((F.col("table") == "live") & F.coalesce(F.col("o_live"), F.lit(False)))
            | ((F.col("table") == "failed") & F.coalesce(F.col("o_failed"), F.lit(False)))
        )
    # one pass: the counts, the span of every event (counted or not: flows_over_time's
    # buckets) from the least and greatest time of each group, and the events per hour
    # (flows_over_time's series when its buckets are whole hours: no pass of its own). The
    # groups are at most the rows, and a few per hour the events span. (Observing the span
    # as the rows went by cost more: an observation takes every row out of the generated
    # code.)
    hour = F.floor(F.col("at") / HOUR_MS).cast("bigint")
    groups = keep(
        snapshot,
        union.groupBy(
            "node", "flow_class", "status", counted.alias("counted"), hour.alias("hour")
        ).agg(F.count("*").alias("flows"), F.min("at").alias("low"), F.max("at").alias("high")),
    )
    span = groups.agg(F.min("low").alias("low"), F.max("high").alias("high")).first()
    low, high = (span["low"], span["high"]) if span is not None else (None, None)
    snapshot.shared_value(("event span",), lambda: (low, high))
    snapshot.shared_value(("events by hour",), lambda: groups)
    frame = keep_in_order(
        snapshot,
        groups.where("counted")
        .groupBy("node", "flow_class", "status")
        .agg(F.sum("flows").alias("flows")),
        "node",
        "flow_class",
        "status",
    )
    totals, first = count_with_first_rows(frame, "status", settings.report_rows, weight="flows")
    total = sum(totals.values())
    parts = ", ".join(f"{count} {status}" for status, count in sorted(totals.items()))
    summary = f"{total} flows on {len(snapshot.nodes)} nodes" + (f": {parts}" if parts else "")
    return CheckResult(
        "flow_counts", "Flows by node, class and status", frame, Verdict(INFO, summary), first=first
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


def checkpoint_costs(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Checkpoint size and journal length by flow class (the cost of a replay).

    The frame has, per flow class, the number of live checkpoints and the mean, median,
    90th and 99th percentile and maximum of ``checkpoint_bytes`` and ``journal_length``,
    largest total first. ``extras["offenders"]`` holds the ``top`` largest checkpoints and
    the ``top`` longest journals; ``extras["size_histogram"]`` the checkpoints per
    power-of-two size bucket. Always ``info``.

    The percentiles are exact (the least value with at least that share of the class's
    values at or below it), from one frequency table of each measure per class: a grouping
    with few groups (sizes and lengths repeat), so no sort and no sketch of every row.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    cp = snapshot.checkpoints
    sizes = keep(snapshot, _frequencies(cp, "checkpoint_bytes"))
    journals = keep(snapshot, _frequencies(cp, "journal_length"))
    frame = (
        _measure_summary(sizes, "bytes")
        .join(_measure_summary(journals, "journal").drop("flows"), "flow_class", "full_outer")
        .select(
            "flow_class",
            "flows",
            F.col("total_bytes"),
            "mean_bytes",
            "p50_bytes",
            "p90_bytes",
            "p99_bytes",
            "max_bytes",
            "mean_journal",
            "p50_journal",
            "p90_journal",
            "p99_journal",
            "max_journal",
        )
    )
    frame = keep_in_order(snapshot, frame, F.desc("total_bytes"), "flow_class")
    columns = ["node", "flow_id", "flow_class", "status", "checkpoint_bytes", "journal_length"]
    measures = (("checkpoint_bytes", sizes), ("journal_length", journals))
    bounds = {measure: _top_bound(table, settings.top) for measure, table in measures}
    # the rows at or above the least of either measure's top values, in one filtered scan
    # of the checkpoints (cached: few rows), then ranked by each; every row when a measure
    # has no value at all
    found = {measure: bound for measure, bound in bounds.items() if bound is not None}
    rows = cp
    if len(found) == len(bounds):
        wanted = [F.col(measure) >= bound for measure, bound in found.items()]
        rows = keep(snapshot, cp.where(wanted[0] | wanted[1]).select(*columns))
    ranked = []
    for measure, _ in measures:
        bound = bounds[measure]
        candidates = rows if bound is None else rows.where(F.col(measure) >= bound)
        order: list[Column | str] = [F.desc(measure), "node", "flow_id"]
        best = candidates.orderBy(*order).limit(settings.top)
        ranked.append(
            best.select(
                F.lit(measure).alias("ranked_by"),
                F.row_number().over(Window.orderBy(*order)).alias("rank"),
                *columns,
            )
        )
    offenders = keep_in_order(snapshot, ranked[0].unionByName(ranked[1]), "ranked_by", "rank")
    exponent = F.when(F.col("v") > 0, F.floor(F.log2("v"))).otherwise(0).cast("int")
    histogram = (
        sizes.groupBy(exponent.alias("exponent"))
        .agg(F.sum("n").alias("flows"))
        .select(
            F.pow(F.lit(2), "exponent").cast("bigint").alias("from_bytes"),
            F.pow(F.lit(2), F.col("exponent") + 1).cast("bigint").alias("to_bytes"),
            "flows",
        )
    )
    histogram = keep_in_order(snapshot, histogram, "from_bytes")
    # a row per flow class: summed up here from the rows the report shows, when they are all
    first = take_first_rows(frame, settings.report_rows)
    if first.complete:
        n = sum(row["flows"] or 0 for row in first.rows)
        b = sum(row["total_bytes"] or 0 for row in first.rows)
        m = max((row["max_bytes"] for row in first.rows if row["max_bytes"] is not None), default=0)
    else:
        total = frame.agg(
            F.sum("flows").alias("n"),
            F.sum("total_bytes").alias("b"),
            F.max("max_bytes").alias("m"),
        ).first()
        assert total is not None  # an aggregation without grouping has one row
        n, b, m = int(total["n"] or 0), int(total["b"] or 0), int(total["m"] or 0)
    summary = f"{n} live checkpoints"
    if n:
        summary += f", {b} bytes in all, the largest {m} bytes"
    return CheckResult(
        "checkpoint_costs",
        "Checkpoint size and journal length (replay cost)",
        frame,
        Verdict(INFO, summary),
        extras={"offenders": offenders, "size_histogram": histogram},
        first=first,
    )


def _top_bound(frequencies: DataFrame, top: int) -> int | None:
    """The least of the ``top`` greatest values of a frequency table (None: it has none)."""
    from pyspark.sql import functions as F

    least = frequencies.where(F.col("v").isNotNull()).orderBy(F.desc("v")).limit(top)
    floor = least.agg(F.min("v")).first()
    return floor[0] if floor is not None and floor[0] is not None else None


PERCENTILES = (50, 90, 99)
"""The percentiles of each measure checkpoint costs reports."""


def _frequencies(checkpoints: DataFrame, measure: str) -> DataFrame:
    """(``flow_class``, ``v``, ``n``): how many checkpoints of a class have each value."""
    from pyspark.sql import functions as F

    return checkpoints.groupBy("flow_class", F.col(measure).alias("v")).agg(F.count("*").alias("n"))


def _measure_summary(frequencies: DataFrame, suffix: str) -> DataFrame:
    """Per class: flows, total, mean, the :data:`PERCENTILES` and maximum of a measure.

    The ``p``-th percentile is the least value whose cumulative count reaches ``p`` percent
    of the class's (non-null) values; nulls count as flows, in nothing else.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    known = F.col("v").isNotNull()
    up_to = (
        Window.partitionBy("flow_class")
        .orderBy("v")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    whole = Window.partitionBy("flow_class")
    counted = frequencies.select(
        "flow_class",
        "v",
        "n",
        F.sum(F.when(known, F.col("n"))).over(up_to).alias("below"),
        F.sum(F.when(known, F.col("n"))).over(whole).alias("values"),
    )
    reached = [
        F.min(F.when(known & (F.col("below") * 100 >= F.col("values") * p), F.col("v"))).alias(
            f"p{p}_{suffix}"
        )
        for p in PERCENTILES
    ]
    return counted.groupBy("flow_class").agg(
        F.sum("n").alias("flows"),
        F.sum(F.col("v") * F.col("n")).alias(f"total_{suffix}"),
        F.round(F.sum(F.col("v") * F.col("n")) / F.sum(F.when(known, F.col("n"))), 1).alias(
            f"mean_{suffix}"
        ),
        *reached,
        F.max("v").alias(f"max_{suffix}"),
    )


def failed_flows(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Hospitalized and failed flows with their error summaries.

    The frame groups them by node, flow class and error: ``HOSPITALIZED`` flows (kept by
    the hospital, with the reason in ``error_message``) and failed flows (by ``error_kind``
    and ``exception_class``), with how many, the latest time and one message.
    ``extras["hospitalized"]`` lists the first ``report_rows`` hospitalized flows by node
    and flow id (their count is exact). ``warn`` when a flow is in the hospital (an
    operator must retry or kill it), else ``info``.
    """
    from pyspark.sql import functions as F

    # the hospitalized rows read once, cached as the grouping reads them: the list of the
    # first of them reads the cache, not every checkpoint's status again
    kept = keep(
        snapshot,
        snapshot.checkpoints.where(F.col("status") == "HOSPITALIZED").select(
            "node", "flow_id", "flow_class", "error_message", "updated_at"
        ),
    )
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
    )
    frame = keep_in_order(snapshot, frame, F.desc("flows"), "node", "flow_class", "outcome")
    # the first of them by node and flow (a top-N, no sort of every row); the count is exact
    settings = settings or CheckSettings()
    listed = keep(
        snapshot,
        first_rows(kept, ["node", "flow_id"], settings.report_rows),
    )
    by_outcome, first = count_with_first_rows(
        frame, "outcome", settings.report_rows, weight="flows"
    )
    kept_count = by_outcome.get("HOSPITALIZED", 0)
    # an outcome that is null counted on neither side, as Spark's ``outcome = 'HOSPITALIZED'``
    failed_count = sum(n for o, n in by_outcome.items() if o not in (None, "HOSPITALIZED"))
    summary = f"{kept_count} in the hospital, {failed_count} failed"
    verdict = Verdict(WARN if kept_count else INFO, summary, kept_count + failed_count)
    return CheckResult(
        "failed_flows",
        "Hospitalized and failed flows",
        frame,
        verdict,
        extras={"hospitalized": listed},
        extra_totals={"hospitalized": kept_count},
        first=first,
    )
