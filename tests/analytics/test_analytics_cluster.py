"""The same ``fiberflow analyze`` job runs unchanged with ``--master`` on a cluster.

``local-cluster[2,1,1024]`` is Spark's own standalone cluster in one machine: a master, two
workers and two executor JVMs apart from the driver, so the JDBC jars must reach the executors
through ``spark.jars``, the checks' Python code runs in the executors' Python workers, and
every shuffle crosses JVMs, as on ``spark://host:7077``. On the corrupted network of
tests/analytics_data.py (every analyzed node's key given, so the blob checks run too), the
cluster's report must say what the shared local session's says: the same verdict, each
check's status and summary, and the same findings row for row; only times and snapshot
stamps differ. The network data and its fixtures are those of ``tests/analytics/test_analytics.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flows.cli.main import main as cli_main
from tests.analytics.test_analytics import broken, clean, require_jdbc
from tests.analytics_data import Injected, NetworkData

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "local-cluster[2,1,1024]"

# module-scoped fixtures, shared with tests/analytics/test_analytics.py
__all__ = [
    "broken",
    "clean",
]


def analyze_argv(data: NetworkData, injected: Injected, report: Path) -> list[str]:
    """Read through JDBC (the executors need the shipped jar), judge a minute after the end."""
    argv = ["analyze", "--read", "jdbc", "--as-of", str(data.now_ms + 60_000), "--grace", "30s"]
    for source in data.sources(injected.nodes):
        argv += ["--node", source]
    for name in injected.nodes:
        argv += ["--key-file", f"{name}={data.keys[name]}"]
    return [*argv, "--json", str(report)]


def verdict(report: dict[str, Any]) -> dict[str, Any]:
    """What a report says, without its times and snapshot stamps."""
    return {
        "status": report["status"],
        "checks": [(c["name"], c["status"], c.get("summary")) for c in report["checks"]],
        "findings": report["findings"],
    }


@pytest.mark.spark
def test_a_cluster_master_gives_the_report_the_local_session_gives(
    spark: Any, broken: tuple[NetworkData, Injected], tmp_path: Path
) -> None:
    require_jdbc()
    data, injected = broken
    local_report = tmp_path / "local.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        local_status = cli_main(analyze_argv(data, injected, local_report))

    cluster_report = tmp_path / "cluster.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            *analyze_argv(data, injected, cluster_report),
            "--master",
            CLUSTER,
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == local_status == 1, done.stdout + done.stderr
    cluster = json.loads(cluster_report.read_text())
    local = json.loads(local_report.read_text())
    assert cluster["spark"]["master"] == CLUSTER and local["spark"]["master"] != CLUSTER
    assert verdict(cluster) == verdict(local)
    statuses = {name: status for name, status, _ in verdict(cluster)["checks"]}
    assert statuses["session_consistency"] == "fail" and statuses["exactly_once_audit"] == "fail"
    assert statuses["checkpoint_blobs"] != "info"  # the keys were given: the blobs were read
