"""A RabbitMQ node of its own for tests, with only a TLS listener, started and stopped here.

The machine's broker (``rabbit@localhost`` on 5672) is shared by other tests and must not be
reconfigured, so TLS tests run a second RabbitMQ node from the same installation: its own
node name (``ff-tls-<random>@localhost``), distribution port, Mnesia, log and config
directories, Erlang cookie (``HOME``) and ``rabbitmq-env.conf`` (an empty one: the machine's
names the shared node), all in a temporary directory. Its only AMQP listener is TLS, on a
free port of 127.0.0.1, with the certificate, key and CA file given.

:meth:`TlsBroker.start` returns once the listener accepts connections (about 4 s here);
:meth:`TlsBroker.stop` runs ``rabbitmqctl -n NODE stop`` and waits for the process (then
kills its process group if it is still there), so nothing is left running. It works as
root: ``/usr/lib/rabbitmq/bin/rabbitmq-server`` runs as the calling user (the
``/usr/sbin`` wrapper would switch to the ``rabbitmq`` user and its cookie).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import attrs

from tests.waiting import wait_until


def _rabbitmq_bin() -> Path:
    """Where the RabbitMQ scripts that run as the calling user are.

    ``FIBERFLOW_TEST_RABBITMQ_BIN`` if set; else the Debian package's library directory (its
    ``/usr/sbin`` wrappers switch to the ``rabbitmq`` user); else wherever
    ``rabbitmq-server`` is on PATH (a generic install).
    """
    configured = os.environ.get("FIBERFLOW_TEST_RABBITMQ_BIN")
    if configured:
        return Path(configured)
    debian = Path("/usr/lib/rabbitmq/bin")
    on_path = shutil.which("rabbitmq-server")
    if debian.is_dir() or on_path is None:
        return debian
    return Path(on_path).parent


RABBITMQ_BIN = _rabbitmq_bin()
"""Where ``rabbitmq-server`` and ``rabbitmqctl`` are run from."""
START_TIMEOUT = 60.0


def rabbitmq_server_problem() -> str | None:
    """Why a RabbitMQ node of its own cannot be started here, or None if it can."""
    for tool in ("rabbitmq-server", "rabbitmqctl"):
        if not (RABBITMQ_BIN / tool).exists():
            return (
                f"{RABBITMQ_BIN / tool} is missing (install the rabbitmq-server package, or "
                "set FIBERFLOW_TEST_RABBITMQ_BIN to the directory holding it)"
            )
    if shutil.which("erl") is None:
        return "erl (Erlang) is not on PATH"
    return None


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@attrs.define
class TlsBroker:
    """A running RabbitMQ node with a TLS listener on ``127.0.0.1:port`` (user guest)."""

    directory: Path
    node: str
    port: int
    process: subprocess.Popen[bytes]
    started_in: float
    """Seconds from launching the node to its TLS listener accepting connections."""
    _epmd_was_running: bool

    @classmethod
    def start(
        cls,
        directory: Path,
        *,
        cacertfile: Path,
        certfile: Path,
        keyfile: Path,
        require_client_certificate: bool = True,
    ) -> TlsBroker:
        """Start a node in ``directory`` (created) serving TLS with these files.

        With ``require_client_certificate`` the broker verifies clients' certificates
        against ``cacertfile`` and refuses clients without one (``verify_peer``,
        ``fail_if_no_peer_cert = true``); otherwise it asks for none.
        """
        directory.mkdir(parents=True, exist_ok=True)
        node = f"ff-tls-{uuid.uuid4().hex[:8]}@localhost"
        port = free_port()
        verify = "verify_peer" if require_client_certificate else "verify_none"
        lines = [
            "listeners.tcp = none",
            f"listeners.ssl.default = 127.0.0.1:{port}",
            f"ssl_options.cacertfile = {cacertfile}",
            f"ssl_options.certfile = {certfile}",
            f"ssl_options.keyfile = {keyfile}",
            "ssl_options.versions.1 = tlsv1.3",
            f"ssl_options.verify = {verify}",
            f"ssl_options.fail_if_no_peer_cert = {str(require_client_certificate).lower()}",
            "log.console = false",
            "log.file.level = info",
        ]
        (directory / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        (directory / "rabbitmq-env.conf").write_text("")
        (directory / "enabled_plugins").write_text("[].\n")
        (directory / "home").mkdir(exist_ok=True)
        epmd_was_running = _epmd_running()
        log = (directory / "server.out").open("ab")
        began = time.monotonic()
        process = subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmq-server")],
            env=_environment(directory, node, free_port()),
            cwd=directory,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        broker = cls(directory, node, port, process, 0.0, epmd_was_running)
        try:
            wait_until(
                broker.accepts,
                f"the TLS broker {node} to listen on 127.0.0.1:{port}",
                START_TIMEOUT,
                check=broker._check_alive,
                poll=0.05,
            )
        except BaseException:
            broker.stop()
            raise
        broker.started_in = time.monotonic() - began
        return broker

    def url(self, host: str = "localhost", user: str = "guest", password: str = "guest") -> str:
        """The ``amqps://`` URL of the default vhost, reached as ``host``."""
        return f"amqps://{user}:{password}@{host}:{self.port}/%2F"

    def accepts(self) -> bool:
        """Whether the TLS listener accepts TCP connections."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def ctl(self, *arguments: str) -> str:
        """Run ``rabbitmqctl -n NODE ...`` against this node; returns its output."""
        result = subprocess.run(
            [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.node, *arguments],
            env=_environment(self.directory, self.node, None),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(arguments)}: {result.stderr.strip()}")
        return result.stdout

    def stop(self) -> None:
        """Stop the node (``rabbitmqctl stop``) and make sure nothing of it is left running."""
        if self.process.poll() is None:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.ctl("stop")
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        if not self._epmd_was_running:  # the node started it: stop it if no node uses it
            subprocess.run(["epmd", "-kill"], capture_output=True, timeout=30, check=False)

    def log_tail(self, lines: int = 30) -> str:
        """The end of the node's log (for failure messages)."""
        logs = [*sorted((self.directory / "log").glob("*.log")), self.directory / "server.out"]
        text = "\n".join(path.read_text(errors="replace") for path in logs if path.exists())
        return "\n".join(text.splitlines()[-lines:])

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(
                f"the TLS broker {self.node} exited with {self.process.returncode}:\n"
                f"{self.log_tail()}"
            )


def _environment(directory: Path, node: str, dist_port: int | None) -> dict[str, str]:
    """The environment of this node's server and CLI: everything in ``directory``."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
    environment.update(
        HOME=str(directory / "home"),
        ERL_EPMD_ADDRESS="127.0.0.1",
        RABBITMQ_NODENAME=node,
        RABBITMQ_CONF_ENV_FILE=str(directory / "rabbitmq-env.conf"),
        RABBITMQ_CONFIG_FILE=str(directory / "rabbitmq.conf"),
        RABBITMQ_ADVANCED_CONFIG_FILE=str(directory / "advanced.config"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(directory / "enabled_plugins"),
        RABBITMQ_MNESIA_BASE=str(directory / "mnesia"),
        RABBITMQ_LOG_BASE=str(directory / "log"),
        RABBITMQ_PLUGINS_EXPAND_DIR=str(directory / "plugins-expand"),
    )
    if dist_port is not None:
        environment["RABBITMQ_DIST_PORT"] = str(dist_port)
    return environment


def _epmd_running() -> bool:
    """Whether an Erlang port mapper answers (the machine's broker started one)."""
    if shutil.which("epmd") is None:
        return False
    result = subprocess.run(["epmd", "-names"], capture_output=True, timeout=30, check=False)
    return result.returncode == 0
