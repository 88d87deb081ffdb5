"""What every check shares: its settings, its verdict and result, and a few helpers.

A check is a function ``(snapshot, settings) -> CheckResult``: a DataFrame of findings, a
:class:`Verdict` (``ok``, ``info``, ``warn`` or ``fail``, a summary, the number of
findings) and supporting DataFrames. Time-based rules compare the tables' millisecond
timestamps with ``CheckSettings.as_of_ms`` (default: the snapshot time, see
:func:`as_of_ms`), so a snapshot of yesterday can be judged as of yesterday.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot

OK = "ok"
"""Nothing to report."""
INFO = "info"
"""Figures to read, not a problem."""
WARN = "warn"
"""Something an operator should look at (a stuck flow, a flow in the hospital)."""
FAIL = "fail"
"""A broken promise (an orphaned session, a message consumed twice)."""
STATUS_ORDER = {OK: 0, INFO: 1, WARN: 2, FAIL: 3}
"""Verdict statuses, mildest first. Only ``fail`` makes ``fiberflow analyze`` exit non-zero."""
MINUTE_MS = 60_000
"""A minute in milliseconds (the tables' time unit)."""
HOUR_MS = 60 * MINUTE_MS
"""An hour in milliseconds."""
DAY_MS = 24 * HOUR_MS
"""A day in milliseconds."""


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
    report_rows: int = 200
    """Findings a check keeps (its first rows by severity, then age) when it can have very
    many (the stuck check): the count stays exact, the full list is written to Parquet only
    when asked (``fiberflow analyze --findings-dir``)."""
    bucket_ms: int | None = None
    """Bucket of the status-over-time series; None: chosen to give at most 48 buckets."""


@attrs.frozen
class FirstRows:
    """A findings frame's first rows, collected by its check with the action that counted them.

    The report shows them instead of asking Spark for the frame's first rows again (a query,
    and on a cold JVM its planning and code generation, saved per check).
    """

    rows: tuple[Any, ...]
    """The frame's first rows (Spark ``Row`` objects), in the frame's order."""
    complete: bool
    """True when ``rows`` are every row of the frame."""


@attrs.frozen
class CheckResult:
    """A check's outcome: its findings as a DataFrame, a verdict and supporting frames."""

    name: str
    title: str
    frame: DataFrame
    verdict: Verdict
    extras: dict[str, DataFrame] = attrs.field(factory=dict)
    total: int | None = None
    """Rows of the full findings list when ``frame`` holds only its first rows (bounded
    findings); None when ``frame`` is the whole list."""
    full: DataFrame | Callable[[], DataFrame] | None = None
    """The full findings list (not cached, computed only when written, see
    :func:`write_findings`) when ``frame`` holds only its first rows; None otherwise. A
    function making it, when even planning it costs a Spark query (it is called only when
    the list is written)."""
    extra_totals: dict[str, int] = attrs.field(factory=dict)
    """Rows of the whole list of each extra that holds only its first rows (by name)."""
    first: FirstRows | None = None
    """The first rows of ``frame``, when the check collected them with its counts
    (:func:`count_with_first_rows`); None: the report collects them."""

    @property
    def findings_frame(self) -> DataFrame:
        """Every finding: ``full`` when the check bounded its frame, else ``frame``."""
        if self.full is None:
            return self.frame
        return self.full() if callable(self.full) else self.full


CheckFunction = Callable[["Snapshot", CheckSettings], CheckResult]
"""A check: the snapshot and the settings in, its result out."""


def as_of_ms(snapshot: Snapshot, settings: CheckSettings) -> int:
    """The "now" of the time-based rules: ``settings.as_of_ms``, else the snapshot time."""
    return settings.as_of_ms if settings.as_of_ms is not None else snapshot.taken_at_ms


def is_analyzed(snapshot: Snapshot, node: Column) -> Column:
    """True where ``node`` is one of the analyzed nodes (its tables are in the snapshot)."""
    from pyspark.sql import functions as F

    return F.array_contains(F.array(*[F.lit(name) for name in snapshot.node_names]), node)


def keep(snapshot: Snapshot, frame: DataFrame) -> DataFrame:
    """Cache a check's (small) result frame until the snapshot closes."""
    cached = frame.cache()
    snapshot.on_close(cached.unpersist)
    return cached


def keep_in_order(snapshot: Snapshot, frame: DataFrame, *order: Column | str) -> DataFrame:
    """Cache a check's (small) result frame as it comes, and hand it back sorted by ``order``.

    The rows are cached unsorted, in the one pass that computes them; each read sorts the
    cached rows. So the first rows (a ``limit``, see :func:`take_first_rows`) are a top-N
    of the cache, where caching the sorted frame would first run a job to sample the
    rows for a range partitioning and a shuffle of every row to sort them.
    """
    return keep(snapshot, frame).orderBy(*order)


def shared(snapshot: Snapshot, name: str, build: Callable[[], DataFrame]) -> DataFrame:
    """A frame several checks use, built and cached once per snapshot (released on close).

    ``name`` identifies it (``"known_flows"``); the first check to ask builds it with
    ``build()``, the others get the same cached frame.
    """
    return snapshot.shared_frame(name, build)


def small_frame(
    snapshot: Snapshot, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[object]]
) -> DataFrame:
    """A few rows as a DataFrame built in the JVM: ``columns`` are (name, Spark type) pairs.

    No Python data is shipped (``createDataFrame`` would start a Python worker and its
    accumulator channel for a handful of counts).
    """
    from pyspark.sql import functions as F

    ddl = ",".join(f"{name}:{kind}" for name, kind in columns)
    structs = [
        F.struct(
            *[
                F.lit(value).cast(kind).alias(name)
                for (name, kind), value in zip(columns, row, strict=True)
            ]
        )
        for row in rows
    ]
    values = F.array(*structs) if structs else F.array().cast(f"array<struct<{ddl}>>")
    return snapshot.spark.range(1).select(F.inline(values))


def first_rows(frame: DataFrame, order: Sequence[Column | str], rows: int) -> DataFrame:
    """The first ``rows`` of ``frame`` in ``order``, without sorting the whole frame.

    Spark plans ``orderBy(...).limit(n)`` as a top-N per partition (``TakeOrderedAndProject``):
    no shuffle of every row, and only ``n`` rows per partition reach the driver.
    """
    return frame.orderBy(*order).limit(rows)


def count_with_first_rows(
    frame: DataFrame, key: str, rows: int, weight: str | None = None
) -> tuple[dict[Any, int], FirstRows]:
    """The rows of ``frame`` counted by the value of column ``key``, and its first ``rows`` rows.

    With ``weight``, the values of that column are summed instead of the rows counted. One
    Spark action when the frame has at most ``rows`` rows (the common case of a check's
    findings): its first ``rows + 1`` rows are collected and counted here; a longer frame
    is counted by Spark (a second action). The first rows go to the report in
    :attr:`CheckResult.first`.
    """
    from pyspark.sql import functions as F

    first = take_first_rows(frame, rows)
    if first.complete:
        counts: Counter[Any] = Counter()
        for row in first.rows:
            counts[row[key]] += 1 if weight is None else int(row[weight] or 0)
        return dict(counts), first
    measure = F.count("*") if weight is None else F.sum(weight)
    counted = frame.groupBy(key).agg(measure.alias("n")).collect()
    return {row[key]: int(row["n"] or 0) for row in counted}, first


def take_first_rows(frame: DataFrame, rows: int) -> FirstRows:
    """The first ``rows`` rows of ``frame`` (one Spark action), and whether they are all of it.

    A check that can judge a short frame from its rows does so in Python and hands them to
    the report (:attr:`CheckResult.first`); a longer one it asks Spark about.
    """
    taken = frame.limit(rows + 1).collect()
    return FirstRows(tuple(taken[:rows]), complete=len(taken) <= rows)


def write_findings(results: Sequence[CheckResult], directory: str) -> dict[str, str]:
    """Write every check's full findings list as Parquet under ``directory/<check name>``.

    Returns the folder of each check. On a cluster ``directory`` must be a folder every
    executor can write (HDFS, S3, a shared mount), like ``--staging-dir``.
    """
    written = {}
    for result in results:
        target = f"{directory.rstrip('/')}/{result.name}"
        result.findings_frame.write.mode("overwrite").parquet(target)
        written[result.name] = target
    return written


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


def worst(results: Sequence[CheckResult]) -> str:
    """The most serious verdict status among ``results`` (``ok`` when empty)."""
    return max((r.verdict.status for r in results), key=STATUS_ORDER.__getitem__, default=OK)
