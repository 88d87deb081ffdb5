"""``fiberflow analyze`` exits 2 with one line when the analysis cannot run, Spark included.

Spark fails for real here: a check's Spark plan that cannot be analyzed (a table that does
not exist), a JDBC read with no driver for its URL (a ``Py4JJavaError`` from the JVM), and,
in a process of its own, a JVM killed in the middle of a check (``Py4JNetworkError``, the
"connection refused" seen under load). Each must give exit status 2, exactly one
``fiberflow analyze:`` line naming the step and the error, and no traceback; the traceback
is logged at DEBUG. A clean run exits 0 and a broken promise 1 (tests/analytics/test_analytics.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from flows.cli.main import main as cli_main
from persistence.analytics import checks
from persistence.analytics.check_results import CheckResult, CheckSettings
from persistence.analytics.checks import CHECKS
from persistence.analytics.failures import first_line
from persistence.analytics.snapshot import Snapshot
from tests.analytics_data import NetworkData, build_clean_network

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> NetworkData:
    return build_clean_network(tmp_path_factory.mktemp("analytics-exit"))


def analyze_argv(network: NetworkData, out: Path) -> list[str]:
    argv = ["analyze", "--read", "arrow", "--as-of", str(network.now_ms + 60_000)]
    for source in network.sources():
        argv += ["--node", source]
    return [*argv, "--json", str(out / "r.json"), "--html", str(out / "r.html")]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli_main(argv)
    return status, stdout.getvalue(), stderr.getvalue()


def failure_lines(stderr: str) -> list[str]:
    """The lines the command wrote about its failure (the progress lines left out)."""
    return [line for line in stderr.splitlines() if line.startswith("fiberflow analyze:")]


def replace_check(monkeypatch: pytest.MonkeyPatch, name: str, check: Any) -> None:
    replaced = tuple((n, check if n == name else f) for n, f in checks.CHECKS)
    assert replaced != checks.CHECKS
    monkeypatch.setattr(checks, "CHECKS", replaced)


# --- without Spark ----------------------------------------------------------------------------


def test_an_unreadable_node_database_is_one_line_and_exit_two(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    status, stdout, stderr = run_cli(["analyze", "--node", f"sqlite:///{garbage}"])
    assert status == 2 and stdout == ""
    (line,) = stderr.splitlines()
    assert line.startswith("fiberflow analyze: ") and "cannot read" in line and str(garbage) in line


def test_the_first_line_of_a_py4j_error_is_the_java_one_with_its_cause() -> None:
    from py4j.protocol import Py4JError, Py4JNetworkError

    refused = ConnectionRefusedError(111, "Connection refused")
    network = Py4JNetworkError(
        "An error occurred while trying to connect to the Java server", refused
    )
    assert first_line(network) == (
        "An error occurred while trying to connect to the Java server "
        "(ConnectionRefusedError: [Errno 111] Connection refused)"
    )
    java = Py4JError(
        "An error occurred while calling o42.load.\n: java.sql.SQLException: No suitable driver\n"
        "\tat java.sql/java.sql.DriverManager.getDriver(DriverManager.java:299)"
    )
    assert first_line(java) == "java.sql.SQLException: No suitable driver"
    assert first_line(Py4JError("x" * 1000)).endswith("…") and len(first_line(Py4JError("y"))) == 1


def test_py4j_tracebacks_on_the_root_logger_are_dropped_while_analyzing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Py4J logs a command it will not retry with ``logging.exception``: the root logger."""
    import py4j.java_gateway

    from flows.cli.analyze import _py4j_quiet

    def root_record(pathname: str) -> logging.LogRecord:
        return logging.getLogger().makeRecord(
            "root", logging.ERROR, pathname, 1059, "Exception while sending command.", (), None
        )

    py4j_file = py4j.java_gateway.__file__
    ours = str(ROOT / "persistence" / "analytics" / "command.py")
    caplog.set_level(logging.INFO)
    with _py4j_quiet():
        logging.getLogger().handle(root_record(py4j_file))
        logging.getLogger().handle(root_record(ours))
    logging.getLogger().handle(root_record(py4j_file))
    assert [r.pathname for r in caplog.records] == [ours, py4j_file]


# --- Spark ------------------------------------------------------------------------------------


@pytest.mark.spark
def test_a_spark_plan_that_fails_is_exit_two_in_one_line(
    spark: Any,
    network: NetworkData,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def query_a_missing_table(snapshot: Snapshot, settings: CheckSettings) -> CheckResult:
        snapshot.spark.sql("SELECT * FROM fiberflow_no_such_table").collect()
        raise AssertionError("the query above must fail")

    replace_check(monkeypatch, "session_consistency", query_a_missing_table)
    with caplog.at_level(logging.DEBUG, logger="fiberflow.analyze"):
        status, stdout, stderr = run_cli(analyze_argv(network, tmp_path))
    assert status == 2, stderr
    (line,) = failure_lines(stderr)
    assert line.startswith(
        "fiberflow analyze: Spark failed while running the cross-node session consistency "
        "check (session_consistency): [TABLE_OR_VIEW_NOT_FOUND]"
    ), line
    assert "fiberflow_no_such_table" in line and "Traceback" not in stderr
    total = len(CHECKS)  # the checks run in report order; the fourth fails
    assert f"✗ [4/{total}] cross-node session consistency" in stderr
    assert f"✓ [3/{total}] stuck flows" in stderr
    assert stdout == "" and not (tmp_path / "r.json").exists()
    (logged,) = [r for r in caplog.records if r.name == "fiberflow.analyze"]
    assert logged.exc_info is not None and logged.levelno == logging.DEBUG
    assert spark.range(3).count() == 3  # the shared session still works


@pytest.mark.spark
def test_a_jdbc_read_without_its_driver_is_exit_two_in_one_line(
    spark: Any, network: NetworkData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_without_a_driver(snapshot: Snapshot, settings: CheckSettings) -> CheckResult:
        reader = snapshot.spark.read.format("jdbc").option("url", "jdbc:fiberflow-none:x")
        reader.option("dbtable", "node_checkpoints").load().collect()
        raise AssertionError("the read above must fail")

    replace_check(monkeypatch, "stuck_flows", read_without_a_driver)
    status, stdout, stderr = run_cli(analyze_argv(network, tmp_path))
    assert status == 2 and stdout == "", stderr
    (line,) = failure_lines(stderr)
    assert line == (
        "fiberflow analyze: Spark failed while running the stuck flows check (stuck_flows): "
        "java.sql.SQLException: No suitable driver"
    ), line
    assert "Traceback" not in stderr and "An error occurred while calling" not in stderr


KILL_THE_JVM = """
import sys
from pyspark import SparkContext
from flows.cli.main import main
from persistence.analytics import checks

def kill_the_jvm(snapshot, settings):
    process = SparkContext._gateway.proc
    process.kill()
    process.wait()
    snapshot.spark.range(3).count()
    raise AssertionError("the count above must fail")

checks.CHECKS = tuple(
    (n, kill_the_jvm if n == "exactly_once_audit" else f) for n, f in checks.CHECKS
)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.spark
def test_a_jvm_lost_in_the_middle_is_exit_two_in_one_line(
    spark: Any, network: NetworkData, tmp_path: Path
) -> None:
    """In a process of its own: the shared test session's JVM must live on."""
    argv = analyze_argv(network, tmp_path)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILL_THE_JVM), *argv],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = failure_lines(done.stderr)
    assert line.startswith(
        "fiberflow analyze: Spark failed while running the exactly-once audit check "
        "(exactly_once_audit): "
    ), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "" and not (tmp_path / "r.json").exists()
