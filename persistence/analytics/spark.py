"""Starting and stopping the Spark session the analytics run on.

``local[*]`` on a laptop, any ``--master`` URL on a cluster. The settings that matter on a
small machine are made here once: the driver binds to ``127.0.0.1`` (an unresolvable host
name kills the JVM gateway), the Python workers are this interpreter, the web UI and Spark's
own console progress bar are off (the report draws its own), and Spark's log is cut down to
errors. The JVM keeps Java's own collector and JIT settings, and cached frames Spark's
compression: switching any of them made no measurable difference on a 10 M-row analysis
(``benchmarks/analytics_pieces.py``; ``benchmarks/results/analytics_pieces.md``).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

INSTALL_HINT = "pip install -e '.[spark]' (PySpark and PyArrow) and a Java 17+ runtime"
"""What to install when :func:`spark_problem` finds something missing."""

_LOG4J_CONFIG = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""
"""Spark's log: errors only (Spark still prints its one-line log-level notice at start)."""


def java_problem() -> str | None:
    """Why no Java runtime can be started, or None."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return None
    if shutil.which("java") is None:
        return "no Java runtime: neither $JAVA_HOME/bin/java nor java on PATH"
    return None


def spark_problem() -> str | None:
    """Why the analytics cannot run here (PySpark or Java missing), or None if they can."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as error:
        return f"{error.name} is not installed ({INSTALL_HINT})"
    return java_problem()


def _warehouse() -> Path:
    """Where Spark's catalog would keep managed tables (none are made): a temporary folder."""
    return Path(tempfile.gettempdir()) / "fiberflow-analytics" / "spark-warehouse"


def _log_config() -> Path:
    directory = Path(tempfile.gettempdir()) / "fiberflow-analytics"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J_CONFIG:
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(_LOG4J_CONFIG)
        temporary.replace(path)
    return path


def spark_session(
    master: str = "local[*]",
    *,
    jars: Sequence[Path] = (),
    app_name: str = "fiberflow-analytics",
    shuffle_partitions: int | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or join) a Spark session for the analytics.

    ``jars`` are the JDBC drivers to put on the class path (see ``find_jdbc_jars``): they can
    only be added when the JVM starts, so a session that is already running keeps its own.
    ``shuffle_partitions`` defaults to the number of cores for a ``local`` master (Spark's
    200 is meant for clusters). ``conf`` adds any other Spark setting (and overrides these).
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    if shuffle_partitions is None and master.startswith("local"):
        shuffle_partitions = max(2, os.cpu_count() or 2)
    log_option = f"-Dlog4j2.configurationFile=file:{_log_config()}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # the catalog's tables are the export's bucketed datasets, external: nothing is
        # written here, but Spark makes the folder (not in the current directory, then)
        .config("spark.sql.warehouse.dir", str(_warehouse()))
        .config("spark.driver.extraJavaOptions", log_option)
        .config("spark.executor.extraJavaOptions", log_option)
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in jars))
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def active_spark() -> SparkSession | None:
    """The Spark session already running in this process, if any."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def stop_spark(spark: SparkSession) -> None:
    """Stop the session *and* its JVM (``spark.stop()`` alone leaves the JVM running).

    The JVM exits when the pipe to its standard input closes; this closes it and waits.
    """
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    finally:
        SparkContext._gateway = None
        SparkContext._jvm = None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(timeout=30)
            except Exception:  # the JVM did not exit on its own: end it
                process.kill()
                process.wait(timeout=30)
