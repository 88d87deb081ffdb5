"""A node process and its database at start: wait for one that is down, refuse a wrong one.

* PostgreSQL refusing connections: the node retries with backoff, one log line per attempt,
  and starts as soon as the database answers (here a TCP relay that opens late).
* Still unreachable after ``database_wait_seconds``: one line, exit status 2.
* A database or role that does not exist, or a SQLite file that cannot be opened: one line
  at once, exit status 2, no traceback.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.conftest import (
    POSTGRES_URL,
    postgres_driver_problem,
    postgres_problem,
    require_service,
)
from tests.process.test_runtime import write_config

FIBERFLOW = [sys.executable, "-m", "flows.cli"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LateRelay:
    """Forwards TCP connections from a local port to PostgreSQL, once :meth:`open` is called.

    Until then nothing listens on the port: connections are refused, as by a database that
    is not up yet.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.port = free_port()
        self._target = target
        self._server: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def open(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port))
        server.settimeout(0.2)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed: the test is over
                return
            upstream = socket.create_connection(self._target)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
        with self._lock:
            for end in self._sockets:
                end.close()


def node_config(tmp_path: Path, database_url: str, **fields: object) -> Path:
    return write_config(
        tmp_path / "alice.toml",
        name="O=Alice,L=London,C=GB",
        database_url=database_url,
        transport_url="sqlite:///queue.db",
        cordapps=["samples.pingpong"],
        **fields,
    )


def run_to_exit(config: Path, timeout: float = 60) -> tuple[int, str]:
    done = subprocess.run(
        [*FIBERFLOW, "node", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stderr


def test_a_node_waits_for_postgresql_and_starts_when_it_answers(tmp_path: Path) -> None:
    require_service("PostgreSQL", postgres_problem())
    target = urlsplit(POSTGRES_URL)
    relay = LateRelay((target.hostname or "127.0.0.1", target.port or 5432))
    url = POSTGRES_URL.replace(f"{target.hostname}:{target.port}", f"127.0.0.1:{relay.port}")
    config = node_config(tmp_path, url, database_schema="ffwait_alice", database_wait_seconds=120)
    log_path = tmp_path / "alice.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [*FIBERFLOW, "node", "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while log_path.read_text().count("cannot reach the database") < 2:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        relay.open()
        while "started (pid" not in log_path.read_text():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline + 60, log_path.read_text()
            time.sleep(0.05)
        waits = [line for line in log_path.read_text().splitlines() if "cannot reach" in line]
        assert "(attempt 1)" in waits[0] and "(attempt 2)" in waits[1]
        assert all("next try in" in line and "***" not in line for line in waits)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log_path.read_text()
        relay.close()
        from foundation.engine import drop_schema

        drop_schema(POSTGRES_URL, "ffwait_alice")


def test_a_node_gives_up_on_an_unreachable_database_after_its_wait(tmp_path: Path) -> None:
    require_service("the PostgreSQL driver", postgres_driver_problem())  # no server needed
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    status, stderr = run_to_exit(node_config(tmp_path, url, database_wait_seconds=1.5))
    assert status == 2, stderr
    assert "Traceback" not in stderr
    assert "cannot reach the database" in stderr
    assert stderr.strip().splitlines()[-1].count("gave up on the database") == 1


@pytest.mark.parametrize(
    ("which", "problem"),
    [
        ("database", 'database "no_such_database_ff" does not exist'),
        ("role", 'role "no_such_role_ff" does not exist'),
        ("sqlite", "unable to open database file"),
    ],
)
def test_a_wrong_database_fails_at_once_with_one_line(
    tmp_path: Path, which: str, problem: str
) -> None:
    if which == "sqlite":
        url = f"sqlite:///{tmp_path / 'missing-directory' / 'alice.db'}"
    else:
        require_service("PostgreSQL", postgres_problem())
        target = urlsplit(POSTGRES_URL)
        host = f"{target.hostname}:{target.port or 5432}"
        url = (
            f"postgresql://postgres@{host}/no_such_database_ff"
            if which == "database"
            else f"postgresql://no_such_role_ff@{host}/test"
        )
    status, stderr = run_to_exit(node_config(tmp_path, url, database_wait_seconds=120))
    assert status == 2, stderr
    lines = [line for line in stderr.splitlines() if "ERROR" in line]
    assert len(lines) == 1 and problem in lines[0], stderr
    assert "Traceback" not in stderr and "cannot reach" not in stderr  # no retry: at once
