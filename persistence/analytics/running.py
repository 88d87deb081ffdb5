"""Running an analysis: :func:`analyze` loads the nodes, runs every check and collects the report.

:class:`Progress` shows each step while Spark works, and :func:`spark_step` names the step in
the Spark jobs it runs (:data:`STEP_PROPERTY`). The command line (``fiberflow analyze``) is
:mod:`flows.cli.analyze`. Only the standard library is imported at module level.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from persistence.analytics.check_results import CheckSettings
    from persistence.analytics.reading import ReadPath
    from persistence.analytics.report import AnalysisReport
    from persistence.analytics.snapshot import Snapshot
    from persistence.analytics.sources import NodeSource

LOG = logging.getLogger("fiberflow.analyze")

STEP_PROPERTY = "fiberflow.analysis.step"
"""The Spark local property naming the step of the analysis each Spark job ran for:
``load``, a check's name (``stuck_flows``), ``findings`` or ``report``. Spark keeps it in
each job's properties, so the event log (``benchmarks/analytics_events.py --queries``) and
the Spark UI's job details tell which check a job belonged to."""


class Progress:
    """A progress line on stderr while Spark works: the step, a spinner and Spark's tasks.

    On a terminal the line redraws itself; elsewhere (a log, a pipe) each step is printed
    once when it ends, with its time (a ✗ instead of the ✓ when it failed). ``doing`` says
    what the current (or failed) step was doing, for the line that reports a failure.
    """

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, stream: TextIO | None = None, spark: SparkSession | None = None) -> None:
        self.stream = stream or sys.stderr
        self.spark = spark
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self._step = ""
        self.doing = "starting"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tasks(self) -> str:
        if self.spark is None:
            return ""
        try:
            tracker = self.spark.sparkContext.statusTracker()
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
        except Exception:  # the context may be stopping: no task counts then
            return ""
        return f" — Spark tasks {done}/{total}" if total else ""

    def _spin(self) -> None:
        frame = 0
        while not self._stop.wait(0.15):
            text = f"\r{self.FRAMES[frame % len(self.FRAMES)]} {self._step}{self._tasks()}"
            self.stream.write(text.ljust(100)[:120])
            self.stream.flush()
            frame += 1

    @contextmanager
    def step(self, text: str, doing: str | None = None) -> Iterator[None]:
        """Show ``text`` while the block runs; print it with its time when it ends.

        ``doing`` (default ``text``) is kept in :attr:`doing` ("running the stuck flows
        check") to say where the analysis stopped if the block raises.
        """
        self._step = text
        self.doing = doing or text
        started = time.perf_counter()
        mark = "✗"
        if self.live:
            self._stop.clear()
            self._thread = threading.Thread(target=self._spin, daemon=True)
            self._thread.start()
        try:
            yield
            mark = "✓"
        finally:
            if self._thread is not None:
                self._stop.set()
                self._thread.join()
                self._thread = None
                self.stream.write("\r" + " " * 120 + "\r")
            self.stream.write(f"{mark} {text} ({time.perf_counter() - started:.1f} s)\n")
            self.stream.flush()


def analyze(
    sources: Sequence[NodeSource],
    settings: CheckSettings,
    *,
    spark: SparkSession,
    jar_search: Sequence[str | Path] | None = None,
    read: ReadPath = "auto",
    staging_dir: Path | None = None,
    progress: Progress | None = None,
    on_snapshot: Callable[[], None] | None = None,
    keys: dict[str, bytes] | None = None,
    findings_dir: str | None = None,
    export_dir: Path | None = None,
) -> AnalysisReport:
    """Snapshot and load the nodes, run every check and collect the report.

    ``keys`` (node name to checkpoint MAC key, as ``--key-file`` gives them) are the nodes
    whose checkpoint blobs the ``checkpoint_blobs`` check opens.
    ``findings_dir``: also write each check's full findings list there as Parquet (the
    report keeps the counts and the first rows). ``export_dir``: read the nodes from their
    Parquet export there (:func:`~persistence.analytics.export.export_nodes` made it)
    instead of the databases.
    """
    from persistence.analytics.check_results import write_findings
    from persistence.analytics.checks import CHECK_TITLES, CHECKS
    from persistence.analytics.report import collect_report

    progress = progress or Progress(stream=io.StringIO())
    started = time.perf_counter()
    plural = "s" if len(sources) != 1 else ""
    if export_dir is not None:
        from persistence.analytics.export_reading import load_export

        with (
            progress.step(
                f"load the export of {len(sources)} node{plural}",
                "reading the Parquet export (after a refresh: writing its bucketed layout)",
            ),
            spark_step(spark, "load"),
        ):
            snapshot = load_export(spark, export_dir, sources)
    else:
        with spark_step(spark, "load"):
            snapshot = _load_databases(
                sources,
                spark=spark,
                jar_search=jar_search,
                read=read,
                staging_dir=staging_dir,
                progress=progress,
                on_snapshot=on_snapshot,
            )
    load_seconds = time.perf_counter() - started
    with snapshot:
        if keys:
            from persistence.analytics.sources import check_key_names

            check_key_names(keys, snapshot.node_names)
            snapshot.checkpoint_keys = dict(keys)
        results = []
        seconds: dict[str, float] = {}
        for index, (name, check) in enumerate(CHECKS, start=1):
            title = CHECK_TITLES.get(name, name)
            with (
                progress.step(
                    f"[{index}/{len(CHECKS)}] {title}", f"running the {title} check ({name})"
                ),
                spark_step(spark, name),
            ):
                began = time.perf_counter()
                results.append(check(snapshot, settings))
                seconds[name] = time.perf_counter() - began
        written: dict[str, str] = {}
        if findings_dir is not None:
            with (
                progress.step(
                    f"write the full findings to {findings_dir}", "writing the full findings"
                ),
                spark_step(spark, "findings"),
            ):
                written = write_findings(results, findings_dir)
        with (
            progress.step("collect the report", "collecting the report"),
            spark_step(spark, "report"),
        ):
            return collect_report(
                snapshot,
                results,
                settings,
                seconds=seconds,
                load_seconds=load_seconds,
                findings=written,
            )


def _load_databases(
    sources: Sequence[NodeSource],
    *,
    spark: SparkSession,
    jar_search: Sequence[str | Path] | None,
    read: ReadPath,
    staging_dir: Path | None,
    progress: Progress,
    on_snapshot: Callable[[], None] | None,
) -> Snapshot:
    from persistence.analytics.loading import load_nodes

    with progress.step(
        f"snapshot and load {len(sources)} node database{'s' if len(sources) != 1 else ''}",
        "reading the node databases",
    ):
        return load_nodes(
            spark,
            sources,
            jar_search=jar_search,
            path=read,
            staging_dir=staging_dir,
            on_snapshot=on_snapshot,
        )


def failure_line(error: BaseException, doing: str) -> str:
    """The one line saying why the analysis stopped while ``doing`` (without the prefix).

    ``Spark failed while running the stuck flows check (stuck_flows): <the Java error>``
    for Spark, its JVM or the Py4J gateway; ``failed while writing the reports:
    PermissionError: ...`` for anything else.
    """
    from persistence.analytics.failures import first_line, spark_errors

    if isinstance(error, spark_errors()):
        return f"Spark failed while {doing}: {first_line(error)}"
    return f"failed while {doing}: {type(error).__name__}: {first_line(error)}"


@contextmanager
def spark_step(spark: SparkSession, step: str) -> Iterator[None]:
    """Name ``step`` in :data:`STEP_PROPERTY` for the Spark jobs run inside (this thread's).

    The value it replaces is put back afterwards (None: no step), also on an error; when
    putting it back fails too (the JVM is gone), the error that ended the step is the one
    raised, so the command's one line names it.
    """
    context = spark.sparkContext
    before = context.getLocalProperty(STEP_PROPERTY)
    context.setLocalProperty(STEP_PROPERTY, step)
    try:
        yield
    except BaseException:
        with suppress(Exception):
            context.setLocalProperty(STEP_PROPERTY, before)  # type: ignore[arg-type]
        raise
    context.setLocalProperty(STEP_PROPERTY, before)  # type: ignore[arg-type]
