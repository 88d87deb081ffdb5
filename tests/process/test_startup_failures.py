"""Start-up failures are one line on stderr and exit 2, never a traceback (issue 18, item 8).

``fiberflow node run``, ``fiberflow demo`` and the operator commands, against a database or a
broker they cannot use; retries only for what can heal (an unreachable broker, for a bounded
time, one line per attempt), and the broker's refusal of a login is final, at start and when
it happens to a running node's reconnection.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from flows.config.runtime import load_config
from flows.process.logs import configure_logging
from flows.process.process import NodeProcess
from tests.conftest import (
    POSTGRES_URL,
    RABBITMQ_URL,
    postgres_problem,
    rabbitmq_problem,
    require_service,
)

ALICE = "O=Alice,L=London,C=GB"
UNUSED_PORT = 5999  # nothing listens here on the test machines


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` logging in as ``user`` with ``password``."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


def with_port(url: str, port: int) -> str:
    """``url`` on another port of the same host."""
    parts = urlsplit(url)
    credentials, at, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{credentials}{at}{host.rsplit(':', 1)[0]}:{port}"))


def wrong_password_url() -> str:
    require_service("RabbitMQ", rabbitmq_problem())
    return with_credentials(RABBITMQ_URL, urlsplit(RABBITMQ_URL).username or "guest", "wrong")


def write_config(directory: Path, database: str, transport: str, *extra: str) -> Path:
    path = directory / "alice.toml"
    path.write_text(
        "\n".join(
            [
                f'name = "{ALICE}"',
                f'database_url = "{database}"',
                f'transport_url = "{transport}"',
                'key_file = "alice.key.pem"',
                *extra,
            ]
        )
        + "\n"
    )
    return path


def fiberflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def assert_one_line_exit_2(done: subprocess.CompletedProcess[str], *words: str) -> str:
    """The command failed with exit 2 and one line on stderr holding ``words``; returns it."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def queue_file(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'queue.db'}"


@pytest.mark.parametrize(
    ("database", "transport", "problem", "operator_problem"),
    [
        ("mysql://user@127.0.0.1/alice", None, "unsupported database scheme 'mysql'", None),
        (
            "sqlite:///{tmp}/missing/dir/alice.db",
            None,
            "unable to open database file",
            # operator commands open an existing node database only (they never create one)
            "no node database at sqlite:///{tmp}/missing/dir/alice.db",
        ),
        (None, "kafka://127.0.0.1:9092", "unsupported transport scheme 'kafka'", None),
    ],
    ids=["mysql", "missing-sqlite-directory", "bad-transport-url"],
)
def test_node_run_and_the_operator_commands_refuse_in_one_line(
    tmp_path: Path,
    database: str | None,
    transport: str | None,
    problem: str,
    operator_problem: str | None,
) -> None:
    database = (database or "sqlite:///{tmp}/alice.db").format(tmp=tmp_path)
    config = write_config(tmp_path, database, transport or queue_file(tmp_path))
    for command in (
        ["node", "run"],
        ["flow", "list"],
        ["flow", "retry", "some-flow"],
        ["checkpoints", "dump", "some-flow"],
        ["node", "drain"],
    ):
        done = fiberflow(*command, "--config", str(config), cwd=tmp_path)
        expected = problem if command == ["node", "run"] else operator_problem or problem
        assert_one_line_exit_2(done, expected.format(tmp=tmp_path))
    assert not (tmp_path / "missing").exists()  # nothing was created on the way


def test_an_unreachable_postgresql_is_retried_for_its_bounded_wait_then_one_line(
    tmp_path: Path,
) -> None:
    require_service("PostgreSQL", postgres_problem())
    unreachable = with_port(POSTGRES_URL, UNUSED_PORT)
    config = write_config(
        tmp_path, unreachable, queue_file(tmp_path), "database_wait_seconds = 1.0"
    )
    done = fiberflow("node", "run", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert all("cannot reach the database" in line for line in lines[:-1]), lines
    assert "gave up on the database" in lines[-1], lines
    listed = fiberflow("flow", "list", "--config", str(config), cwd=tmp_path)
    assert_one_line_exit_2(listed, "cannot use the database", f":{UNUSED_PORT}")


def test_a_wrong_broker_password_is_final_at_once_for_node_run_demo_and_amqp_setup(
    tmp_path: Path,
) -> None:
    wrong = wrong_password_url()
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'alice.db'}", wrong)
    done = fiberflow("node", "run", "--config", str(config), cwd=tmp_path)
    line = assert_one_line_exit_2(done, "refused the login of user", "ACCESS_REFUSED")
    assert "wrong" not in line  # the password stays hidden
    demo = fiberflow(
        "demo", "--flows", "1", "--directory", "demo", "--transport", wrong, cwd=tmp_path
    )
    assert_one_line_exit_2(demo, "could not start", "refused the login")
    setup = fiberflow("amqp-setup", "--admin-url", wrong, "--node", f"{ALICE}=alice", cwd=tmp_path)
    assert_one_line_exit_2(setup, "fiberflow amqp-setup: ", "refused the login")


def test_an_unreachable_broker_is_retried_for_a_bounded_time_one_line_per_attempt(
    tmp_path: Path,
) -> None:
    require_service("RabbitMQ", rabbitmq_problem())
    unreachable = with_port(RABBITMQ_URL, UNUSED_PORT)
    config = write_config(tmp_path, f"sqlite:///{tmp_path / 'alice.db'}", unreachable)
    done = fiberflow("node", "run", "--config", str(config), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    *attempts, last = done.stderr.strip().splitlines()
    assert attempts, done.stderr  # it was retried
    for number, line in enumerate(attempts, start=1):  # one line per attempt, nothing else
        assert "cannot reach the broker" in line and f"attempt {number}," in line, line
    assert last.startswith(f"fiberflow node run: {ALICE}: TransportError: cannot reach"), last


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


def test_a_running_node_whose_login_is_refused_on_reconnect_stops_with_one_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker drops the node's user (its connections close); reconnecting is refused:
    the node stops with exit 2 and an ERROR line, rather than retrying for ever."""
    require_service("RabbitMQ", rabbitmq_problem())
    require_service(
        "rabbitmqctl", None if shutil.which("rabbitmqctl") else "rabbitmqctl is not on PATH"
    )
    user, password = f"ff-refused-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    vhost = urlsplit(RABBITMQ_URL).path.lstrip("/").replace("%2F", "/") or "/"
    rabbitmqctl("add_user", user, password)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        name = f"O=Alice {user},L=London,C=GB"
        config_path = write_config(
            tmp_path,
            f"sqlite:///{tmp_path / 'alice.db'}",
            with_credentials(RABBITMQ_URL, user, password),
            'status_file = "alice.status.json"',
        )
        config_path.write_text(config_path.read_text().replace(ALICE, name))
        process = NodeProcess(load_config(config_path))
        codes: list[int] = []
        thread = threading.Thread(
            target=lambda: codes.append(process.run(install_signal_handlers=False))
        )
        caplog.set_level(logging.INFO)
        configure_logging("INFO")
        thread.start()
        try:
            status = tmp_path / "alice.status.json"
            for _ in range(1200):  # until it serves (or stopped)
                if status.exists() or not thread.is_alive():
                    break
                time.sleep(0.05)
            assert status.exists(), caplog.text
            rabbitmqctl("delete_user", user)  # the broker closes its connections
            thread.join(120)
        finally:
            process.request_stop()
            thread.join(60)
        assert codes == [2], caplog.text
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert any(
            "refused the login" in r.getMessage() and "stopping the node" in r.getMessage()
            for r in errors
        ), caplog.text
        assert not any("cannot consume from" in r.getMessage() for r in caplog.records)
    finally:
        subprocess.run(["rabbitmqctl", "delete_user", user], capture_output=True, timeout=120)
        from messaging.amqp import delete_queues

        delete_queues(RABBITMQ_URL, f"O=Alice {user},L=London,C=GB")
