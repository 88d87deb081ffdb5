"""The ``flow_counts`` check (``info``): flows by node, flow class and status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.check_results import (
    HOUR_MS,
    INFO,
    CheckResult,
    CheckSettings,
    Verdict,
    count_with_first_rows,
    keep,
    keep_in_order,
)
from persistence.analytics.screening import screen
from persistence.analytics.session_flows import FLOW_KEY, flow_keys

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot

BROADCAST_ROWS = 200_000
"""Up to this many flows in more than one table, the flow counts leave them out through a
broadcast (a scan, no shuffle); more use plain joins."""


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
        return flow_keys(frame, *tagged)

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
