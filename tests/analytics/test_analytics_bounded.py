"""Bounded findings: exact counts, the first rows in the report, the full list in Parquet.

The network data and its fixtures are those of ``tests/analytics/test_analytics.py``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import pytest

from persistence.analytics import CheckSettings, analyze, parse_node_argument
from persistence.analytics.report import render_text
from tests.analytics.test_analytics import broken, clean, require_jdbc, rows
from tests.analytics_data import Injected, NetworkData

# module-scoped fixtures, shared with tests/analytics/test_analytics.py
__all__ = [
    "broken",
    "clean",
]


@pytest.mark.spark
def test_stuck_findings_are_bounded_with_exact_counts_and_the_full_list_in_parquet(
    spark: Any, broken: tuple[NetworkData, Injected], tmp_path: Path
) -> None:
    """Judged two days on, most flows are stuck: the report keeps the first rows only."""
    require_jdbc()
    data, injected = broken
    sources = [parse_node_argument(s) for s in data.sources(injected.nodes)]
    later = data.now_ms + 2 * 86_400_000
    whole = analyze(sources, CheckSettings(as_of_ms=later, grace_ms=30_000), spark=spark)
    every = rows(whole, "stuck_flows")
    assert len(every) > 3
    folder = tmp_path / "findings"
    bounded = analyze(
        sources,
        CheckSettings(as_of_ms=later, grace_ms=30_000, report_rows=2),
        spark=spark,
        findings_dir=str(folder),
    )
    check = bounded.check("stuck_flows")
    assert check.table.total == len(every) == check.findings
    assert [dict(zip(check.table.columns, r, strict=True)) for r in check.table.rows] == every[:2]
    assert check.summary == whole.check("stuck_flows").summary + "; the 2 longest shown"
    written = spark.read.parquet(str(folder / "stuck_flows"))
    assert written.columns == check.table.columns
    key = ("node", "flow_id", "session_id")
    assert sorted((tuple(r[k] for k in key), r.asDict()) for r in written.collect()) == sorted(
        (tuple(r[k] for k in key), r) for r in every
    )
    assert bounded.findings["stuck_flows"] == str(folder / "stuck_flows")
    assert {p.name for p in folder.iterdir()} >= {"stuck_flows", "session_consistency"}
    text = render_text(bounded)
    assert f"{len(every)} findings; the report keeps the first 2" in text


@pytest.mark.spark
@pytest.mark.parametrize("rows_kept", [3, 10])
def test_counts_and_first_rows_are_exact_whether_or_not_the_frame_fits(
    spark: Any, rows_kept: int
) -> None:
    """Short frames are counted from their collected rows, long ones by Spark: same counts."""
    from pyspark.sql import functions as F

    from persistence.analytics.check_results import count_with_first_rows

    frame = (
        spark.range(6)
        .select(
            F.col("id"),
            F.when(F.col("id") < 4, "a").otherwise("b").alias("kind"),
            (F.col("id") * 10).alias("weight"),
        )
        .orderBy("id")
    )
    counts, first = count_with_first_rows(frame, "kind", rows_kept)
    assert counts == {"a": 4, "b": 2}
    assert first.complete is (rows_kept >= 6)
    assert [row["id"] for row in first.rows] == list(range(min(rows_kept, 6)))
    sums, _ = count_with_first_rows(frame, "kind", rows_kept, weight="weight")
    assert sums == {"a": 60, "b": 90}


class _FrameThatMustNotRun:
    """A stand-in DataFrame: the report may read its columns, never run it."""

    columns: ClassVar[list[str]] = ["id", "kind"]

    def limit(self, rows: int) -> Any:
        raise AssertionError("the report asked Spark for rows it already had")

    def count(self) -> int:
        raise AssertionError("the report asked Spark for a count it already had")


def test_the_report_shows_the_rows_its_check_collected_without_asking_spark_again() -> None:
    """A check's collected first rows are the report's table: no second query."""
    from persistence.analytics.check_results import FirstRows
    from persistence.analytics.report import collect_table

    frame: Any = _FrameThatMustNotRun()
    whole = FirstRows(((1, "a"), (2, "b")), complete=True)
    table = collect_table(frame, 200, first=whole)
    assert (table.rows, table.total) == ([[1, "a"], [2, "b"]], 2)
    longer = FirstRows(((1, "a"), (2, "b"), (3, "c")), complete=False)
    table = collect_table(frame, 2, total=7, first=longer)
    assert (table.rows, table.total) == ([[1, "a"], [2, "b"]], 7)
    with pytest.raises(AssertionError, match="rows it already had"):
        collect_table(frame, 5, first=longer)  # fewer than asked for: Spark must be asked


@pytest.mark.spark
@pytest.mark.parametrize("bucket_hours", [1, 3, 0])
def test_the_series_from_flow_counts_hours_equals_a_pass_of_its_own(
    spark: Any, clean: NetworkData, tmp_path: Path, bucket_hours: int
) -> None:
    """flows_over_time summed from flow_counts' events per hour, or read anew: same rows.

    The events are spread over 30 hours; 0 hours is a 15-minute bucket, which the hourly
    events cannot give (read anew in both runs).
    """
    from persistence.analytics import load_nodes
    from persistence.analytics.check_results import HOUR_MS, MINUTE_MS
    from persistence.analytics.checks import flow_counts, flows_over_time

    require_jdbc()
    data = clean.copy_to(tmp_path / "spread")
    for path in data.databases.values():
        with sqlite3.connect(path) as connection:
            for table, column in (
                ("node_checkpoints", "updated_at"),
                ("node_flow_results", "completed_at"),
                ("node_flow_exceptions", "failed_at"),
            ):
                connection.execute(
                    f"UPDATE {table} SET {column} = {column} - (rowid % 30) * {HOUR_MS} - rowid"
                )
        connection.close()
    sources = [parse_node_argument(s) for s in data.sources()]
    bucket = bucket_hours * HOUR_MS or 15 * MINUTE_MS
    settings = CheckSettings(bucket_ms=bucket)
    with load_nodes(spark, sources) as snapshot:
        alone = flows_over_time(snapshot, settings)  # no flow_counts before it: its own pass
        expected = alone.frame.collect()
    with load_nodes(spark, sources) as snapshot:
        flow_counts(snapshot, settings)
        assert snapshot.shared_value(("events by hour",), lambda: None) is not None
        shared = flows_over_time(snapshot, settings)
        assert shared.frame.collect() == expected
        assert shared.verdict.summary == alone.verdict.summary
    assert len({row["bucket_start_ms"] for row in expected}) > 2  # spread, not one bucket
    assert sum(row["flows"] for row in expected) > 0


class _Releases:
    """A stand-in snapshot for ``keep``: it only collects what to release on close."""

    def __init__(self) -> None:
        self.releases: list[Any] = []

    def on_close(self, release: Any) -> None:
        self.releases.append(release)


@pytest.mark.spark
def test_a_kept_frames_first_rows_are_a_top_n_of_its_cache_not_a_sort_of_every_row(
    spark: Any,
) -> None:
    """keep_in_order: the same first rows as caching the sorted frame, in fewer Spark jobs.

    Caching a sorted frame sorts every row as the cache fills (a job sampling the rows for a
    range partitioning, a shuffle of every row); a frame cached as it comes and sorted when
    read gives its first rows as a top-N of the cache.
    """
    from pyspark.sql import functions as F

    from persistence.analytics.check_results import keep, keep_in_order, take_first_rows

    def frame() -> Any:
        return spark.range(0, 5_000, numPartitions=4).select(
            ((F.col("id") * 7_919) % 5_000).alias("v"), (F.col("id") % 7).alias("kind")
        )

    groups = iter(range(1_000))

    def jobs_of(run: Any) -> tuple[Any, int]:
        group = f"kept-{next(groups)}"
        context = spark.sparkContext
        context.setJobGroup(group, "test")
        try:
            result = run()
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
        return result, len(context.statusTracker().getJobIdsForGroup(group))

    stand_in: Any = _Releases()
    kept = keep_in_order(stand_in, frame(), "kind", "v")
    kept_first, kept_jobs = jobs_of(lambda: take_first_rows(kept, 10))
    sorted_first, sorted_jobs = jobs_of(
        lambda: take_first_rows(keep(stand_in, frame().orderBy("kind", "v")), 10)
    )
    assert kept_first == sorted_first
    expected = sorted((i % 7, i * 7_919 % 5_000) for i in range(5_000))[:10]
    assert [(row["kind"], row["v"]) for row in kept_first.rows] == expected
    assert kept_jobs == 1 < sorted_jobs, (kept_jobs, sorted_jobs)
    again, jobs_again = jobs_of(lambda: kept.count())  # the cache filled: read, not recomputed
    assert again == 5_000 and jobs_again <= 2
    for release in stand_in.releases:
        release()


@pytest.mark.spark
@pytest.mark.parametrize("journals_follow_sizes", [False, True])
def test_checkpoint_costs_rank_both_measures_from_one_scan(
    spark: Any, journals_follow_sizes: bool
) -> None:
    """The largest checkpoints and the longest journals, when they are different flows too.

    The offenders come from one filtered scan of the checkpoints for both measures (rows at
    or above either measure's bound): a scan by the size bound alone would miss the longest
    journals of small checkpoints.
    """
    from persistence.analytics.checks import checkpoint_costs
    from persistence.analytics.snapshot import Snapshot

    rows = [
        (
            "O=Alice,L=London,C=GB",
            f"flow-{i:03d}",
            "samples.Ping",
            "RUNNABLE",
            1_000 + 37 * i,
            (5 + 3 * i) if journals_follow_sizes else (500 - 7 * i),
        )
        for i in range(60)
    ]
    checkpoints = spark.createDataFrame(
        rows,
        "node string, flow_id string, flow_class string, status string, "
        "checkpoint_bytes bigint, journal_length bigint",
    )
    snapshot = Snapshot(spark=spark, nodes=[], frames={"checkpoints": checkpoints})
    try:
        result = checkpoint_costs(snapshot, CheckSettings(top=10))
        offenders = result.extras["offenders"].collect()
    finally:
        snapshot.close()
    for measure, column in (("checkpoint_bytes", 4), ("journal_length", 5)):
        ranked = [row for row in offenders if row["ranked_by"] == measure]
        expected = sorted(rows, key=lambda row: (-row[column], row[0], row[1]))[:10]
        assert [row["flow_id"] for row in ranked] == [row[1] for row in expected]
        assert [row["rank"] for row in ranked] == list(range(1, 11))
