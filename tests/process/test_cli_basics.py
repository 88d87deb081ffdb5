"""The command line's basics: --version, --log-level for every command, quiet libraries, and
the package's typing marker and license (issue 18)."""

from __future__ import annotations

import importlib.metadata
import logging
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from flows.cli import main as cli
from flows.cli.main import main
from flows.process.logs import configure_logging
from persistence.store import NodeDatabase

ROOT = Path(__file__).resolve().parents[2]


def fiberflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_version_prints_the_installed_version() -> None:
    done = fiberflow("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"fiberflow {importlib.metadata.version('fiberflow')}"


def test_a_bad_log_level_is_one_line_and_exit_2_naming_the_levels() -> None:
    done = fiberflow("--log-level", "loud", "demo", "--flows", "1")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "'loud' is not a log level (use one of DEBUG, INFO, WARNING, ERROR, CRITICAL)" in (
        done.stderr
    )


def test_the_global_log_level_reaches_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Operator commands log at ``--log-level`` (WARNING without it); a node process takes it
    over its config's ``log_level``."""
    levels: list[str] = []
    monkeypatch.setattr(cli, "configure_logging", levels.append)
    runs: list[str | None] = []
    monkeypatch.setattr(cli, "run_node", lambda config, worker, log_level: runs.append(log_level))
    config = tmp_path / "node.toml"
    config.write_text(
        'name = "O=Alice,L=London,C=GB"\n'
        f'database_url = "sqlite:///{tmp_path / "alice.db"}"\n'
        f'transport_url = "sqlite:///{tmp_path / "queue.db"}"\n'
    )
    NodeDatabase(f"sqlite:///{tmp_path / 'alice.db'}").close()  # as the node makes it
    assert main(["--log-level", "debug", "flow", "list", "--config", str(config)]) == 0
    assert main(["flow", "list", "--config", str(config)]) == 0
    assert levels == ["DEBUG", "WARNING"]
    main(["--log-level", "error", "node", "run", "--config", str(config)])
    main(["node", "run", "--config", str(config)])
    assert runs == ["ERROR", None]  # (None: the config's log_level)
    assert levels == ["DEBUG", "WARNING"]  # a node process configures its own


def test_pika_speaks_only_at_warning_unless_asked_for_debug() -> None:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), logging.getLogger("pika").level)
    try:
        configure_logging("INFO")
        assert logging.getLogger("pika").level == logging.WARNING
        configure_logging("ERROR")
        assert logging.getLogger("pika").level == logging.ERROR
        configure_logging("DEBUG")
        assert logging.getLogger("pika").level == logging.DEBUG
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        logging.getLogger("pika").setLevel(saved[2])


def test_main_accepts_a_lower_case_level(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--log-level", "info", "--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith("fiberflow ")


def test_every_package_is_marked_typed_and_the_license_is_spdx_with_its_file() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    packages = ["flows", "statemachine", "messaging", "persistence", "samples"]
    assert all((ROOT / package / "py.typed").is_file() for package in packages)
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert package_data["package-data"]["*"] == ["py.typed"]


def test_crash_at_refuses_a_point_that_would_never_fire_and_lists_the_points(
    tmp_path: Path,
) -> None:
    from flows.testing import CRASH_POINTS, MockNetwork
    from tests.simulation import CRASH_POINTS as SIMULATED

    network = MockNetwork(cordapps=["samples.pingpong"], directory=tmp_path)
    try:
        node = network.create_node("O=Alice,L=London,C=GB")
        with pytest.raises(ValueError, match="no crash point 'after_comit'") as refused:
            node.crash_at("after_comit")
        assert "after_commit" in str(refused.value) and "during_replay" in str(refused.value)
        assert set(SIMULATED) <= set(CRASH_POINTS)  # every point the campaigns use is valid
        node.crash_at("after_commit")  # a real one is armed
    finally:
        network.stop_nodes()


def test_demo_refuses_a_bad_timeout_and_a_non_postgresql_database_creating_nothing(
    tmp_path: Path,
) -> None:
    for arguments, problem in (
        (["--timeout", "-1"], "--timeout must be a positive number of seconds, not -1"),
        (["--database", "sqlite:///x.db"], "--database takes a postgresql:// URL"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "flows.cli", "demo", "--directory", "work", *arguments],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert done.returncode == 2 and problem in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no x.db, no work directory
