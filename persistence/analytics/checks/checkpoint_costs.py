"""The ``checkpoint_costs`` check (``info``): checkpoint size and journal length by flow class."""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.check_results import (
    INFO,
    CheckResult,
    CheckSettings,
    Verdict,
    keep,
    keep_in_order,
    take_first_rows,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot


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
