"""Shared fixtures: the CorDapps, the database backends, the mock network; the tiers.

Tests live in a folder per tier: ``tests/unit`` (no services, no processes, no Spark: the
fast loop), ``tests/integration`` (PostgreSQL, RabbitMQ), ``tests/process`` (real node
processes, subprocesses, a browser) and ``tests/analytics`` (Spark). Each test is marked with
its folder's tier. The modules beside this one are the tests' shared support (CorDapps,
harnesses, campaigns).

Every network test runs on SQLite and on PostgreSQL (in the unit tier on SQLite, and again
in the integration tier on PostgreSQL: ``tests/integration/postgresql``). PostgreSQL is taken from
``FIBERFLOW_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``); if it
cannot be reached the PostgreSQL cases skip with the reason, unless
``FIBERFLOW_REQUIRE_SERVICES=1`` (set by ``.ci/run``), which turns the skip into a failure.

Test modules that need an optional package at import time (pika) skip it first with
``pytest.importorskip(package, reason=...)`` naming the package and the extra that installs
it; under ``FIBERFLOW_REQUIRE_SERVICES=1`` such a skipped module is a failure too.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from flows.testing import MockNetwork

CORDAPPS = ["samples.pingpong", "samples.trade", "tests.cordapp"]
POSTGRES_URL = os.environ.get(
    "FIBERFLOW_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
REQUIRE_SERVICES = os.environ.get("FIBERFLOW_REQUIRE_SERVICES") == "1"
BACKENDS = ["sqlite", "postgresql"]
PSYCOPG_MISSING = "psycopg is not installed (pip install -e '.[dev,postgres]')"
PIKA_MISSING = "pika is not installed (pip install -e '.[dev,amqp]')"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """With ``FIBERFLOW_REQUIRE_SERVICES=1``, a module skipped at import is a failure."""
    report = yield
    if REQUIRE_SERVICES and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"required here (FIBERFLOW_REQUIRE_SERVICES=1): {reason}"
    return report


TIERS = ("unit", "integration", "process", "analytics")
"""The test tiers, a folder each under ``tests/``; a test's tier is its folder."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, from the folder it is in (``-m unit`` selects a tier)."""
    root = Path(__file__).resolve().parent
    for item in items:
        parts = Path(item.path).resolve().relative_to(root).parts
        if parts and parts[0] in TIERS:
            item.add_marker(parts[0])


NODE_LOG_TAIL_LINES = 40
"""How many lines of each node process's log a failed test's report shows."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that ran node processes shows the end of their logs in its report.

    Node processes log to ``*.log`` files under the test's ``tmp_path``; in CI those files are
    gone with the clone, so the report is the only place a failure's evidence survives
    (pika's chatter is left out), with their status files. A fixture with a ``log_tail()``
    (a broker or database server of the tests' own) adds its log's end too.
    """
    report = yield
    if not report.failed or report.when != "call":
        return report
    funcargs = getattr(item, "funcargs", {})
    for name, value in funcargs.items():
        log_tail = getattr(value, "log_tail", None)
        if callable(log_tail):
            try:
                report.sections.append((f"log of fixture {name} (end)", str(log_tail())))
            except Exception as error:  # evidence only: never hide the test's own failure
                report.sections.append((f"log of fixture {name}", f"unreadable: {error}"))
    tmp_path = funcargs.get("tmp_path")
    if isinstance(tmp_path, Path) and tmp_path.is_dir():
        for log_file in sorted(tmp_path.rglob("*.log"))[:8]:
            lines = [
                line
                for line in log_file.read_text(errors="replace").splitlines()
                if " pika." not in line
            ]
            tail = "\n".join(lines[-NODE_LOG_TAIL_LINES:])
            report.sections.append((f"node log {log_file.name} (end)", tail))
        for status_file in sorted(tmp_path.rglob("*.status.json"))[:8]:
            text = status_file.read_text(errors="replace")
            report.sections.append((f"node status {status_file.name}", text))
    return report


def postgres_driver_problem() -> str | None:
    """Why the PostgreSQL driver cannot be imported (psycopg is missing), or None."""
    return None if importlib.util.find_spec("psycopg") is not None else PSYCOPG_MISSING


@functools.cache
def postgres_problem() -> str | None:
    """Why PostgreSQL cannot be used for tests, or None if it can."""
    try:
        import psycopg
    except ImportError:
        return PSYCOPG_MISSING
    try:
        conninfo = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(conninfo, connect_timeout=5) as connection:
            connection.execute("select 1")
    except Exception as error:  # any connection failure is a reason to skip
        return f"cannot connect to {POSTGRES_URL}: {error}"
    return None


def require_service(name: str, problem: str | None) -> None:
    """Skip (or, in CI, fail) when a service a test needs is not there."""
    if problem is None:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"{name} is required here (FIBERFLOW_REQUIRE_SERVICES=1): {problem}")
    pytest.skip(f"{name} not available: {problem}")


def database_for(backend: str) -> str:
    """The ``MockNetwork(database=...)`` argument for a backend name."""
    if backend == "postgresql":
        require_service("PostgreSQL", postgres_problem())
        return POSTGRES_URL
    return backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The database of the nodes: ``"sqlite"`` or a PostgreSQL URL."""
    return database_for(str(request.param))


@pytest.fixture
def net(tmp_path: Path, backend: str) -> Iterator[MockNetwork]:
    network = MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=backend)
    yield network
    network.stop_nodes()


@pytest.fixture(autouse=True)
def _reset_test_behaviour() -> Iterator[None]:
    from tests import cordapp

    cordapp.BEHAVIOUR.clear()
    yield
    cordapp.BEHAVIOUR.clear()


RABBITMQ_URL = os.environ.get(
    "FIBERFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"
)


@functools.cache
def rabbitmq_problem() -> str | None:
    """Why RabbitMQ cannot be used for tests, or None if it can."""
    try:
        import pika
    except ImportError:
        return PIKA_MISSING
    try:
        parameters = pika.URLParameters(RABBITMQ_URL)
        parameters.socket_timeout = 5
        connection = pika.BlockingConnection(parameters)
        connection.close()
    except Exception as error:  # any connection failure is a reason to skip
        return f"cannot connect to {RABBITMQ_URL}: {error!r}"
    return None


@functools.cache
def spark_test_problem() -> str | None:
    """Why Spark cannot run the analytics tests here (PySpark or Java missing), or None."""
    from persistence.analytics.spark import spark_problem

    return spark_problem()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local Spark session for every Spark test (UI off, the JDBC jars on its class path).

    Skips when PySpark or Java is missing (fails with ``FIBERFLOW_REQUIRE_SERVICES=1``); the
    JVM is stopped at the end of the session, not only the context.
    """
    require_service("Spark", spark_test_problem())
    from persistence.analytics import find_jdbc_jars, spark_session, stop_spark

    session = spark_session(
        "local[2]",
        jars=find_jdbc_jars().paths(),
        app_name="fiberflow-tests",
        shuffle_partitions=2,
        # one JVM serves every Spark test of the run: Spark's default heap (1 GiB), then
        # 2 GiB, ran out of room for a broadcast late in a run of the analytics tests
        conf={"spark.driver.memory": "4g"},
    )
    yield session
    stop_spark(session)
