"""``fiberflow analyze``: the command line of the analytics.

Only the standard library is imported at module level, so the CLI can register the
subcommand without PySpark installed; running it without PySpark (or Java) prints what to
install and exits with 2.

Exit status: 0 when no check failed (warnings included), 1 when a check failed (a broken
promise), 2 when the analysis could not run: a bad argument, a node database that cannot be
read, Spark or its JVM failing at any step (one line on stderr names the step and the
error; the traceback is logged at DEBUG), or a report that cannot be written.
"""

from __future__ import annotations

import argparse
import datetime
import io
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from persistence.analytics.checking import CheckSettings
    from persistence.analytics.export import NodeExport
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

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str) -> int:
    """``90s``, ``10m``, ``2h``, ``1d``, ``250ms`` (or plain seconds) to milliseconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 10m, 2h or 1d")
    return round(float(match[1]) * _UNITS[match[2] or "s"])


def parse_moment(text: str) -> int:
    """An ISO-8601 time (UTC unless it says otherwise) or epoch milliseconds, to milliseconds."""
    if text.strip().isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO-8601 time or epoch ms") from error
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return round(moment.timestamp() * 1000)


def add_analyze_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``fiberflow analyze``."""
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="a node database, e.g. sqlite:///alice.db (its node name is found in the other "
        "nodes' tables) or with its name, 'O=Alice,L=London,C=GB=sqlite:///alice.db', "
        "'O=Bob,L=Paris,C=FR=postgresql://user@host/db?schema=bob' (repeat for each node)",
    )
    parser.add_argument(
        "--key-file",
        action="append",
        default=[],
        metavar="NODE=PATH",
        help="a node's key file (the Ed25519 PEM its config names as key_file), e.g. "
        "'O=Alice,L=London,C=GB=alice.key.pem': its checkpoint blobs are opened and checked "
        "(checkpoint_blobs; without a key a node is not checked). Repeat for each node",
    )
    parser.add_argument(
        "--node-config",
        action="append",
        default=[],
        metavar="PATH",
        help="a node config (TOML): its database is analyzed as a --node and its key_file "
        "used as its --key-file (repeat for each node)",
    )
    parser.add_argument("--master", default="local[*]", help="Spark master URL (local[*])")
    parser.add_argument(
        "--as-of",
        type=parse_moment,
        help="judge as of this time (ISO-8601 or epoch ms; default: the snapshot time)",
    )
    parser.add_argument(
        "--stuck-after",
        type=parse_duration,
        default="10m",
        help="a flow waiting longer is stuck (10m)",
    )
    parser.add_argument(
        "--outbox-after",
        type=parse_duration,
        default="5m",
        help="an older outbox row is undelivered (5m)",
    )
    parser.add_argument(
        "--grace",
        type=parse_duration,
        default="60s",
        help="cross-node rules ignore evidence newer than this (60s)",
    )
    parser.add_argument("--top", type=int, default=10, help="top offenders to list (10)")
    parser.add_argument("--bucket", type=parse_duration, help="time bucket of the status series")
    parser.add_argument(
        "--json", type=Path, default=Path("fiberflow-analysis.json"), help="JSON report path"
    )
    parser.add_argument(
        "--html", type=Path, default=Path("fiberflow-analysis.html"), help="HTML report path"
    )
    parser.add_argument(
        "--rows", type=int, default=20, help="rows per table in the printed report (20)"
    )
    parser.add_argument(
        "--read",
        choices=["auto", "jdbc", "arrow"],
        default="auto",
        help="JDBC, Arrow (SQLAlchemy -> Parquet), or auto: JDBC where a driver jar is found",
    )
    parser.add_argument(
        "--jdbc-jars",
        action="append",
        metavar="DIR",
        help="where to look for JDBC jars (default $FIBERFLOW_JDBC_JARS or /usr/share/java)",
    )
    parser.add_argument(
        "--staging-dir", type=Path, help="folder for snapshots and Parquet (shared on a cluster)"
    )
    parser.add_argument(
        "--findings-dir",
        help="also write every check's full findings list as Parquet here, one folder per "
        "check (the report holds the counts and the first rows); on a cluster a folder every "
        "executor can write",
    )
    parser.add_argument(
        "--export-dir",
        type=Path,
        help="first bring the Parquet export of the nodes in DIR up to date (incrementally: "
        "new, changed and deleted rows), then analyze the export instead of reading the "
        "databases; on a cluster a folder every executor can read",
    )
    parser.add_argument(
        "--export-only",
        action="store_true",
        help="with --export-dir: refresh the export and stop (no Spark)",
    )
    parser.add_argument(
        "--no-refresh",
        action="store_true",
        help="with --export-dir: analyze the export as it is, without opening the databases "
        "(refresh it on its own schedule with --export-only; the report says when each node "
        "was exported)",
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting"
    )


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

    ``keys`` (node name to checkpoint MAC key, see :mod:`persistence.analytics.keys`) are
    the nodes whose checkpoint blobs the ``checkpoint_blobs`` check opens.
    ``findings_dir``: also write each check's full findings list there as Parquet (the
    report keeps the counts and the first rows). ``export_dir``: read the nodes from their
    Parquet export there (:func:`~persistence.analytics.export.export_nodes` made it)
    instead of the databases.
    """
    from persistence.analytics.checking import write_findings
    from persistence.analytics.checks import CHECK_TITLES, CHECKS
    from persistence.analytics.report import collect_report

    progress = progress or Progress(stream=io.StringIO())
    started = time.perf_counter()
    plural = "s" if len(sources) != 1 else ""
    if export_dir is not None:
        from persistence.analytics.export import load_export

        with (
            progress.step(
                f"load the export of {len(sources)} node{plural}", "reading the Parquet export"
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
            from persistence.analytics.keys import check_key_names

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


def run_analyze(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``fiberflow analyze`` with parsed ``args``; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    from persistence.analytics.keys import (
        KeyArgumentError,
        load_keys,
        node_config_argument,
        parse_key_argument,
    )
    from persistence.analytics.session import spark_problem
    from persistence.analytics.sources import (
        NodeArgumentError,
        check_unique_names,
        parse_node_argument,
    )

    try:
        node_keys = [parse_key_argument(item) for item in args.key_file]
        configured = [node_config_argument(path) for path in args.node_config]
        node_keys += [key for _, key in configured]
        arguments = list(args.node) + [argument for argument, _ in configured]
        args.node = arguments  # every node's argument, those from --node-config included
        if not arguments:
            raise ValueError("give at least one --node (or --node-config)")
        sources = [parse_node_argument(item) for item in arguments]
        check_unique_names(sources)
        keys = load_keys(node_keys)
        if keys and args.export_dir is not None:
            raise ValueError(
                "the checkpoint_blobs check opens the blobs in the node databases, and the "
                "Parquet export holds none: give the keys (--key-file, --node-config) "
                "without --export-dir"
            )
        conf = dict(_key_value(item) for item in args.conf)
    except (NodeArgumentError, KeyArgumentError, ValueError) as error:
        err.write(f"fiberflow analyze: {error}\n")
        return 2
    from persistence.analytics.opening import probe_source
    from persistence.analytics.snapshot import AnalyticsLoadError

    if args.export_only and args.export_dir is None:
        err.write("fiberflow analyze: --export-only needs --export-dir\n")
        return 2
    if args.no_refresh and (args.export_dir is None or args.export_only):
        err.write("fiberflow analyze: --no-refresh needs --export-dir, without --export-only\n")
        return 2
    try:
        for source in sources if not args.no_refresh else ():  # before Spark's 10-20 s start
            probe_source(source)
    except AnalyticsLoadError as error:
        err.write(f"fiberflow analyze: {error}\n")
        return 2
    if args.export_only:
        progress = Progress(stream=err)
        try:
            _export(args, sources, progress, err, None)
        except AnalyticsLoadError as error:
            err.write(f"fiberflow analyze: {error}\n")
            return 2
        except Exception as error:
            err.write(f"fiberflow analyze: {failure_line(error, progress.doing)}\n")
            LOG.debug("the export failed", exc_info=True)
            return 2
        return 0
    problem = spark_problem()
    if problem is not None:
        err.write(f"fiberflow analyze: cannot run Spark here: {problem}\n")
        return 2
    from persistence.analytics.checking import CheckSettings

    settings = CheckSettings(
        as_of_ms=args.as_of,
        stuck_after_ms=args.stuck_after,
        outbox_after_ms=args.outbox_after,
        grace_ms=args.grace,
        top=args.top,
        bucket_ms=args.bucket,
    )
    progress = Progress(stream=err)
    try:
        with _py4j_quiet():
            return _run_spark(args, sources, settings, conf, progress, out, keys)
    except (AnalyticsLoadError, KeyArgumentError) as error:
        err.write(f"fiberflow analyze: {error}\n")
        return 2
    except Exception as error:  # the command's edge: one line, exit 2 ("could not run")
        err.write(f"fiberflow analyze: {failure_line(error, progress.doing)}\n")
        LOG.debug("fiberflow analyze failed while %s", progress.doing, exc_info=True)
        return 2


def _export(
    args: argparse.Namespace,
    sources: Sequence[NodeSource],
    progress: Progress,
    err: TextIO,
    running: Future[list[NodeExport]] | None,
) -> None:
    """Refresh the export, or wait for the refresh ``running`` in the background.

    Then say what it did, one line per node.
    """
    from persistence.analytics.export import export_nodes

    plural = "s" if len(sources) != 1 else ""
    with progress.step(
        f"export {len(sources)} node{plural} to {args.export_dir}"
        + (" (while Spark started)" if running is not None else ""),
        "exporting the node tables",
    ):
        if running is not None:
            exported = running.result()
        else:
            exported = export_nodes(sources, args.node, args.export_dir)
    for node in exported:
        read = sum(t.changed + t.reread for t in node.tables.values())
        kind = "full" if node.full else "incremental"
        err.write(
            f"  {node.name}: {kind} export in {node.seconds:.1f} s, {read} rows read, "
            f"{node.snapshot}\n"
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


@contextmanager
def _py4j_quiet() -> Iterator[None]:
    """Silence Py4J's own logged tracebacks unless the log level is DEBUG.

    The failure is reported in one line; its traceback is logged at DEBUG. Py4J logs
    through its ``py4j`` loggers and, when a command fails on a connection it will not
    retry, through the root logger itself (``logging.exception``): records the root
    logger gets from Py4J's modules are dropped as well.
    """
    logger = logging.getLogger("py4j")
    root = logging.getLogger()
    before = logger.level
    quiet = not LOG.isEnabledFor(logging.DEBUG)
    if quiet:
        logger.setLevel(logging.CRITICAL)
        root.addFilter(_not_from_py4j)
    try:
        yield
    finally:
        logger.setLevel(before)
        root.removeFilter(_not_from_py4j)


def _not_from_py4j(record: logging.LogRecord) -> bool:
    """False for a record Py4J's own code logged (on the root logger): drop it."""
    return _PY4J_FOLDER not in record.pathname


_PY4J_FOLDER = f"{os.sep}py4j{os.sep}"


def _run_spark(
    args: argparse.Namespace,
    sources: Sequence[NodeSource],
    settings: CheckSettings,
    conf: dict[str, str],
    progress: Progress,
    out: TextIO,
    keys: dict[str, bytes] | None = None,
) -> int:
    """Start (or join) Spark, analyze, print and write the reports; the exit status."""
    from persistence.analytics.checking import FAIL
    from persistence.analytics.report import render_text, write_json
    from persistence.analytics.report_html import write_html
    from persistence.analytics.session import active_spark, spark_session
    from persistence.analytics.sources import find_jdbc_jars

    exporting: Future[list[NodeExport]] | None = None
    if args.export_dir is not None and not args.no_refresh:  # the refresh while the JVM starts
        from persistence.analytics.export import export_nodes

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fiberflow-export")
        exporting = pool.submit(export_nodes, sources, args.node, args.export_dir)
        pool.shutdown(wait=False)
    running = active_spark()
    if running is None:
        starting, doing = f"start Spark ({args.master})", f"starting Spark ({args.master})"
    else:
        starting, doing = "join the running Spark session", "joining the running Spark session"
    with progress.step(starting, doing):
        spark = running or spark_session(
            args.master, jars=find_jdbc_jars(args.jdbc_jars).paths(), conf=conf
        )
    progress.spark = spark
    try:
        if exporting is not None:
            _export(args, sources, progress, progress.stream, exporting)
        report = analyze(
            sources,
            settings,
            spark=spark,
            jar_search=args.jdbc_jars,
            read=args.read,
            staging_dir=args.staging_dir,
            progress=progress,
            keys=keys,
            findings_dir=args.findings_dir,
            export_dir=args.export_dir,
        )
    finally:
        progress.spark = None
        if running is None:
            _stop(spark, progress)
    progress.doing = "writing the reports"
    out.write(render_text(report, max_rows=args.rows))
    write_json(report, str(args.json))
    write_html(report, str(args.html))
    out.write(f"Reports: {args.json} and {args.html}\n")
    return 1 if report.status == FAIL else 0


def _stop(spark: SparkSession, progress: Progress) -> None:
    """Stop Spark; a step of its own when Java's ahead-of-time cache is made meanwhile."""
    from persistence.analytics.session import makes_cache_at_stop

    if not makes_cache_at_stop():
        _stop_quietly(spark)
        return
    with progress.step(
        "stop Spark and make Java's ahead-of-time cache (once)",
        "making Java's ahead-of-time cache",
    ):
        _stop_quietly(spark)


def _stop_quietly(spark: SparkSession) -> None:
    """Stop Spark and its JVM; a JVM already gone is not a second error to report."""
    from persistence.analytics.session import stop_spark

    try:
        stop_spark(spark)
    except Exception:
        LOG.debug("stopping Spark failed", exc_info=True)


def _key_value(item: str) -> tuple[str, str]:
    key, separator, value = item.partition("=")
    if not separator or not key:
        raise ValueError(f"--conf {item!r} must be KEY=VALUE")
    return key, value


def analyze_main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point (``python -m persistence.analytics.command``)."""
    parser = argparse.ArgumentParser(prog="fiberflow analyze", description=__doc__)
    add_analyze_arguments(parser)
    return run_analyze(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(analyze_main())
