"""The ``failed_flows`` check (``warn`` when a flow is in the hospital, else ``info``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.check_results import (
    INFO,
    WARN,
    CheckResult,
    CheckSettings,
    Verdict,
    count_with_first_rows,
    first_rows,
    keep,
    keep_in_order,
)

if TYPE_CHECKING:
    from persistence.analytics.snapshot import Snapshot


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
