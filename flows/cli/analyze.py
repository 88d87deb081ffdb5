"""``fiberflow analyze``: the command line of the analytics (:mod:`persistence.analytics`).

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
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from persistence.analytics.running import Progress, analyze, failure_line

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from persistence.analytics.check_results import CheckSettings
    from persistence.analytics.export import NodeExport
    from persistence.analytics.sources import NodeSource

LOG = logging.getLogger("fiberflow.analyze")

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


def run_analyze(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``fiberflow analyze`` with parsed ``args``; returns the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    from flows.cli.analyze_keys import load_keys, node_config_argument, parse_key_argument
    from persistence.analytics.sources import (
        KeyArgumentError,
        NodeArgumentError,
        check_unique_names,
        parse_node_argument,
    )
    from persistence.analytics.spark import spark_problem

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
    from persistence.analytics.tables import AnalyticsLoadError

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
    from persistence.analytics.check_results import CheckSettings

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
    from persistence.analytics.check_results import FAIL
    from persistence.analytics.report import render_text, write_json
    from persistence.analytics.report_html import write_html
    from persistence.analytics.sources import find_jdbc_jars
    from persistence.analytics.spark import active_spark, spark_session

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
            _stop_quietly(spark)
    progress.doing = "writing the reports"
    out.write(render_text(report, max_rows=args.rows))
    write_json(report, str(args.json))
    write_html(report, str(args.html))
    out.write(f"Reports: {args.json} and {args.html}\n")
    return 1 if report.status == FAIL else 0


def _stop_quietly(spark: SparkSession) -> None:
    """Stop Spark and its JVM; a JVM already gone is not a second error to report."""
    from persistence.analytics.spark import stop_spark

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
    """Stand-alone entry point (``python -m flows.cli.analyze``)."""
    parser = argparse.ArgumentParser(prog="fiberflow analyze", description=__doc__)
    add_analyze_arguments(parser)
    return run_analyze(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(analyze_main())
