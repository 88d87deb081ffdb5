"""The node runtime: one node in its own process, from a TOML config file.

``fiberflow node run --config node.toml`` builds a :class:`NodeProcess` and runs it until
SIGTERM or SIGINT, then shuts down cleanly (stop consuming, stop the relay, close the
database; every flow stays checkpointed). The config file::

    name = "O=Alice,L=London,C=GB"          # the node's X.500 name (required)
    database_url = "sqlite:///alice.db"      # required; relative SQLite paths are taken
                                             # relative to the config file's directory
    transport_url = "sqlite:///queue.db"     # required: sqlite, postgresql or amqp URL
    cordapps = ["samples.pingpong"]          # modules holding the node's flows
    network_map = "network-map"              # directory of node-info files (default)
    database_schema = "alice"                # optional, PostgreSQL only
    synchronous = "FULL"                     # optional, SQLite durability level
    status_file = "alice.status.json"        # optional: statistics, rewritten every second
    log_level = "INFO"                       # optional
    key_file = "alice.key.pem"               # optional: the node's Ed25519 key pair
    receive_timeout = 3600                   # optional: seconds, or "forever"
    limits = { max_bytes = 16777216, max_depth = 64 }   # optional: payload/message limits
    lease_seconds = 20                       # optional: the node lease's length
    database_wait_seconds = 60               # optional: wait this long for the database
    busy_warning_seconds = 5                 # optional: log flows running this long

A bad config fails at start with the file and the field named (:class:`ConfigError`).

One process runs a node at a time: at start the process takes the node's lease
(:mod:`persistence.lease`) and renews it on a thread of its own. A second process on the same
node refuses to start with one line naming the holder (exit status 2). A process that loses
the lease (it was paused or cut off past its expiry and another took over) commits nothing
more and exits with status 3.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import tomllib
from pathlib import Path
from types import FrameType
from typing import Any

import attrs
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from flows.busy import BusyMonitor, BusyWatchdog, NodeStopping
from flows.cordapps import CordappError, Cordapps
from flows.hospital import RECOVERED_AFTER_SECONDS, Hospital
from flows.identity import NetworkMapPeerKeys, NodeIdentity, load_or_create_identity
from flows.network_map import NetworkMap, NetworkMapError, NodeInfo, node_key
from flows.node import DEFAULT_RECEIVE_TIMEOUT, Node, NodeConfig
from flows.party import Party
from messaging.codec import wire_limits_problem
from messaging.transports import TransportUrlError, open_transport, transport_scheme
from persistence.engine import is_permanent_connect_error
from persistence.lease import (
    DEFAULT_LEASE_SECONDS,
    LeaseHeldError,
    LeaseKeeper,
    LeaseLostError,
    NodeLease,
    WorkerInfo,
    application_name,
)
from persistence.serialization import DEFAULT_LIMITS, SerializationLimits
from persistence.store import NodeDatabase

log = logging.getLogger("fiberflow.runtime")

REQUEST_POLL_SECONDS = 0.05
"""How often an idle node looks for new flow requests."""
IDLE_WAIT_SECONDS = 0.05
STATUS_SECONDS = 1.0
REPORT_SECONDS = 10.0

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "database_url": str,
    "transport_url": str,
    "cordapps": list,
    "network_map": str,
    "database_schema": str,
    "synchronous": str,
    "status_file": str,
    "log_level": str,
    "key_file": str,
    "receive_timeout": (int, float, str),
    "limits": dict,
    "lease_seconds": (int, float),
    "database_wait_seconds": (int, float),
    "busy_warning_seconds": (int, float),
}
_REQUIRED = ("name", "database_url", "transport_url")


class ConfigError(ValueError):
    """A node config that cannot be used; the message names the file and the field."""


DEFAULT_BUSY_WARNING_SECONDS = 5.0
"""A flow whose code runs this long without suspending is logged (and shown as RUNNING)."""
DEFAULT_DATABASE_WAIT_SECONDS = 60.0
"""How long a starting node retries a database that refuses connections."""

EXIT_REFUSED = 2
"""Exit status of a node process that could not start (bad config, another holder)."""
EXIT_LEASE_LOST = 3
"""Exit status of a node process that lost its lease to another process."""


@attrs.frozen
class RuntimeConfig:
    """A node process's configuration (see the module docstring)."""

    name: str
    database_url: str
    transport_url: str
    cordapps: tuple[str, ...] = ()
    network_map: Path | None = None
    database_schema: str | None = None
    synchronous: str = "FULL"
    status_file: Path | None = None
    log_level: str = "INFO"
    key_file: Path | None = None
    """The node's Ed25519 key pair (PEM, mode 0600), created at first start."""
    receive_timeout: float | None = DEFAULT_RECEIVE_TIMEOUT
    """Seconds a receive waits when the flow gives no timeout (None: forever)."""
    limits: SerializationLimits = DEFAULT_LIMITS
    """What payloads and session messages may be (size, depth, lengths), both ways."""
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """How long the node lease lasts without renewal (renewed every third of it)."""
    database_wait_seconds: float = DEFAULT_DATABASE_WAIT_SECONDS
    """How long a starting node waits for an unreachable database before giving up."""
    busy_warning_seconds: float = DEFAULT_BUSY_WARNING_SECONDS
    """A flow whose code runs this long without suspending is logged and listed."""

    def node_config(self) -> NodeConfig:
        """The :class:`NodeConfig` of the node."""
        return NodeConfig(
            name=self.name,
            database_url=self.database_url,
            cordapps=self.cordapps,
            synchronous=self.synchronous,
            database_schema=self.database_schema,
            receive_timeout=self.receive_timeout,
            lease_seconds=self.lease_seconds,
            limits=self.limits,
        )


def load_config(path: str | Path) -> RuntimeConfig:
    """Read and check a node config file; raises :class:`ConfigError` naming the problem."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config: {error}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from error
    return config_from_mapping(document, path.resolve().parent, str(path))


def config_from_mapping(
    document: dict[str, Any], base: Path, source: str = "config"
) -> RuntimeConfig:
    """Check a parsed config (paths relative to ``base``); see :func:`load_config`."""

    def fail(field: str, problem: str) -> ConfigError:
        return ConfigError(f"{source}: field {field!r}: {problem}")

    unknown = sorted(set(document) - set(_FIELDS))
    if unknown:
        raise fail(unknown[0], f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    for field in _REQUIRED:
        if field not in document:
            raise fail(field, "missing (required)")
    for field, expected in _FIELDS.items():
        if field in document and not isinstance(document[field], expected):
            names = " or ".join(
                t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,))
            )
            raise fail(field, f"must be a {names}, not {document[field]!r}")
    try:
        Party(document["name"])
    except ValueError as error:
        raise fail("name", str(error)) from None
    cordapps = tuple(document.get("cordapps", ()))
    if not all(isinstance(c, str) for c in cordapps):
        raise fail("cordapps", "must be a list of module names")
    try:
        Cordapps(cordapps)
    except CordappError as error:
        raise fail("cordapps", str(error)) from None
    database_url = _resolve_sqlite(document["database_url"], base)
    if "://" not in database_url:
        raise fail("database_url", f"{database_url!r} is not a URL (e.g. sqlite:///alice.db)")
    transport_url = _resolve_sqlite(document["transport_url"], base)
    try:
        transport_scheme(transport_url)
    except TransportUrlError as error:
        raise fail("transport_url", str(error)) from None
    synchronous = document.get("synchronous", "FULL")
    if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise fail("synchronous", "must be OFF, NORMAL, FULL or EXTRA")
    level = document.get("log_level", "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise fail("log_level", "must be DEBUG, INFO, WARNING or ERROR")
    schema = document.get("database_schema")
    if schema is not None and not database_url.startswith("postgres"):
        raise fail("database_schema", "is for PostgreSQL databases only")
    network_map = base / document.get("network_map", "network-map")
    status_file = document.get("status_file")
    key_file = base / document.get("key_file", f"{node_key(document['name'])}.key.pem")
    receive_timeout: float | None = DEFAULT_RECEIVE_TIMEOUT
    if "receive_timeout" in document:
        value = document["receive_timeout"]
        if value == "forever":
            receive_timeout = None
        elif isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            receive_timeout = float(value)
        else:
            raise fail("receive_timeout", 'must be positive seconds or "forever"')
    limits = DEFAULT_LIMITS
    if "limits" in document:
        known = {f.name for f in attrs.fields(SerializationLimits)}
        unknown_limits = sorted(set(document["limits"]) - known)
        if unknown_limits:
            raise fail("limits", f"unknown limit {unknown_limits[0]!r} (known: {sorted(known)})")
        try:
            limits = SerializationLimits(**document["limits"])
        except (TypeError, ValueError) as error:
            raise fail("limits", str(error)) from None
        problem = wire_limits_problem(limits)
        if problem is not None:
            raise fail("limits", problem)
    lease_seconds = document.get("lease_seconds", DEFAULT_LEASE_SECONDS)
    if isinstance(lease_seconds, bool) or not lease_seconds > 0:
        raise fail("lease_seconds", "must be positive seconds")
    database_wait = document.get("database_wait_seconds", DEFAULT_DATABASE_WAIT_SECONDS)
    if isinstance(database_wait, bool) or not database_wait >= 0:
        raise fail("database_wait_seconds", "must be zero or positive seconds")
    busy_warning = document.get("busy_warning_seconds", DEFAULT_BUSY_WARNING_SECONDS)
    if isinstance(busy_warning, bool) or not busy_warning > 0:
        raise fail("busy_warning_seconds", "must be positive seconds")
    return RuntimeConfig(
        name=document["name"],
        database_url=database_url,
        transport_url=transport_url,
        cordapps=cordapps,
        network_map=network_map,
        database_schema=schema,
        synchronous=synchronous,
        status_file=None if status_file is None else base / status_file,
        log_level=level,
        key_file=key_file,
        receive_timeout=receive_timeout,
        limits=limits,
        lease_seconds=float(lease_seconds),
        database_wait_seconds=float(database_wait),
        busy_warning_seconds=float(busy_warning),
    )


def _resolve_sqlite(url: str, base: Path) -> str:
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        relative = url[len(prefix) :]
        if relative and relative != ":memory:":
            return prefix + str((base / relative).resolve())
    return url


def _first_line(error: BaseException) -> str:
    """The first line of an error's message (drivers add hints and SQL on later lines)."""
    text = str(getattr(error, "orig", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _safe_url(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        credentials, host = rest.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}" if ":" in credentials else url
    return url


class NodeProcess:
    """Runs one node until asked to stop (see the module docstring)."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self.node: Node | None = None
        self.hospital = Hospital()
        self.recoveries = 0
        """Node-wide failures: rounds that failed and were resumed from the last checkpoints
        (failures pinned on a flow or a message are counted by ``hospital.pinned``)."""
        self._last_failure = 0.0
        self._next_poll = 0.0
        self._identity_cache: NodeIdentity | None = None
        self._started_at = time.time()
        self.worker = WorkerInfo.of_this_process()
        """This process as a worker of the node (its id names its lease and consumer)."""
        self.lease: NodeLease | None = None
        self.busy = BusyMonitor()
        """Which flow's code runs now, across rebuilds of the node (the watchdog reads it)."""
        self._watchdog: BusyWatchdog | None = None
        self.lease_lost: LeaseLostError | None = None
        """Set when the lease was lost: the process stops and exits with status 3."""

    def request_stop(self) -> None:
        """Ask the loop to stop after its current round (safe from any thread)."""
        self._stop.set()
        if self.node is not None:
            self.node.wakeup.set()

    def _on_signal(self, number: int, _: FrameType | None) -> None:
        if not self._stop.is_set():
            name = signal.Signals(number).name
            log.info("%s: received %s, shutting down", self.config.name, name)
        self.request_stop()
        if self._watchdog is not None:
            self._watchdog.stop_requested()
            self._watchdog.interrupt_if_due()  # flow code that overstays: NodeStopping

    def run(self, install_signal_handlers: bool = True) -> int:
        """Start the node, serve until stopped, shut down cleanly; returns the exit status.

        0 after a clean stop, :data:`EXIT_REFUSED` if another process holds the node's lease,
        :data:`EXIT_LEASE_LOST` if this one lost it while running.
        """
        config = self.config
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self._identity_cache = self._identity()
        lease_database = self._open_database()
        if lease_database is None:
            return EXIT_REFUSED
        try:
            lease = lease_database.new_lease(self.worker, config.lease_seconds)
            try:
                lease.acquire()
            except LeaseHeldError as error:
                log.error("%s: %s", config.name, error)
                return EXIT_REFUSED
            except OperationalError as error:
                if "locked" not in str(error):
                    raise
                log.error(
                    "%s: the node database is write-locked by another process (a node "
                    "running it, busy in a long transaction?); refusing to start",
                    config.name,
                )
                return EXIT_REFUSED
            self.lease = lease
            keeper = LeaseKeeper(lease, self._on_lease_lost, config.name)
            keeper.start()
            watchdog = BusyWatchdog(
                self.busy,
                config.busy_warning_seconds,
                lease_database.control.note_busy_flow,
                lease_database.control.clear_busy_flow,
                config.name,
            )
            self._watchdog = watchdog
            watchdog.start()
            try:
                return self._run_holding_lease(lease)
            finally:
                watchdog.close()
                self._watchdog = None
                keeper.stop()
                if self.lease_lost is None:
                    lease.release()
        finally:
            lease_database.close()

    def _open_database(self) -> NodeDatabase | None:
        """The node database, waiting (with backoff) while it cannot be reached.

        One log line per attempt. A problem waiting cannot cure (a wrong password, a missing
        database) ends the wait at once; so does running out of ``database_wait_seconds``.
        Returns None when the node must not start (the reason was logged).
        """
        config = self.config
        url = _safe_url(config.database_url)
        deadline = time.monotonic() + config.database_wait_seconds
        attempt = 0
        while True:
            attempt += 1
            try:
                return NodeDatabase(
                    config.database_url,
                    synchronous=config.synchronous,
                    schema_name=config.database_schema,
                    application_name=application_name(self.worker.worker_id),
                )
            except (SQLAlchemyError, OSError) as error:
                problem = _first_line(error)
                if is_permanent_connect_error(error):
                    log.error("%s: cannot use the database %s: %s", config.name, url, problem)
                    return None
                delay = min(0.5 * 2 ** (attempt - 1), 10.0)
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error(
                        "%s: gave up on the database %s after %d attempts in %.0f s: %s",
                        config.name,
                        url,
                        attempt,
                        config.database_wait_seconds,
                        problem,
                    )
                    return None
                delay = min(delay, left)
                log.warning(
                    "%s: cannot reach the database %s (attempt %d): %s; next try in %.1f s",
                    config.name,
                    url,
                    attempt,
                    problem,
                    delay,
                )
                if self._stop.wait(delay):
                    return None

    def _on_lease_lost(self, error: LeaseLostError) -> None:
        """The lease was lost (from the keeper thread, or a fenced commit): stop at once."""
        if self.lease_lost is None:
            self.lease_lost = error
            log.error(
                "%s: lost the node lease: %s; committing nothing more and exiting",
                self.config.name,
                error,
            )
        self.request_stop()

    def _run_holding_lease(self, lease: NodeLease) -> int:
        config = self.config
        node = self._build_node()
        self._publish(node)
        log.info(
            "%s: started (pid %d, worker %s, lease epoch %d): %d flows restored from %s, %d "
            "outbox messages re-sent; transport %s; cordapps %s",
            config.name,
            os.getpid(),
            self.worker.worker_id[:8],
            max(lease.epochs.values()),
            node.restored_flows,
            _safe_url(config.database_url),
            node.resent_messages,
            _safe_url(config.transport_url),
            ", ".join(config.cordapps) or "none",
        )
        try:
            self._serve()
        finally:
            final = self.node
            assert final is not None
            self._write_status(final, running=False)
            final.stop()
            if self.lease_lost is None:
                log.info("%s: stopped cleanly; every unfinished flow is checkpointed", config.name)
        return EXIT_LEASE_LOST if self.lease_lost is not None else 0

    def _build_node(self) -> Node:
        """A node from the config, started: flows restored, flows kept in the hospital kept."""
        config = self.config
        assert self._identity_cache is not None
        network_map = NetworkMap(config.network_map or Path("network-map"))
        transport = open_transport(
            config.transport_url, config.name, consumer_id=self.worker.worker_id
        )
        node = Node(
            config.node_config(),
            transport,
            identity=self._identity_cache,
            peers=NetworkMapPeerKeys(network_map),
            background_relay=True,
            lease=self.lease,
            hospital=self.hospital,
            busy=self.busy,
        )
        self.node = node
        if self._stop.is_set():
            node.wakeup.set()
        try:
            node.start()
        except BaseException:
            with contextlib.suppress(Exception):  # what started must not leak
                node.stop()
            raise
        return node

    def _recover(self, error: BaseException) -> None:
        """A node-wide failure: drop the node's memory, resume from the last checkpoints.

        (Failures pinned on one flow or one message never get here: the manager treats them
        by the flow hospital's rules while the node goes on.)
        """
        diagnosis = self.hospital.diagnose(error)
        delay = self.hospital.backoff_seconds()
        self.recoveries += 1
        self._last_failure = time.monotonic()
        level = logging.WARNING if diagnosis.rule == "transient" else logging.ERROR
        log.log(
            level,
            "%s: hospital rule %s (node-wide): %s; resuming every flow from its last "
            "checkpoint in %.2f s",
            self.config.name,
            diagnosis.rule,
            diagnosis.reason,
            delay,
            exc_info=diagnosis.rule == "unknown",
        )
        with contextlib.suppress(Exception):  # the database may be the thing that is down
            if self.node is not None:
                self.node.stop()
        if self._stop.wait(delay):
            return
        while not self._stop.is_set():
            try:
                self._build_node()
                return
            except LeaseLostError as lost:
                self._on_lease_lost(lost)
                return
            except Exception as rebuild_error:  # still down: keep trying, backing off
                self.hospital.diagnose(rebuild_error)
                delay = self.hospital.backoff_seconds()
                log.warning(
                    "%s: cannot resume yet (%s); next try in %.2f s",
                    self.config.name,
                    rebuild_error,
                    delay,
                )
                self._stop.wait(delay)

    def _identity(self) -> NodeIdentity:
        if self.config.key_file is None:
            raise ConfigError(f"node {self.config.name}: field 'key_file': not set")
        path = self.config.key_file
        created = not path.exists()
        identity = load_or_create_identity(path, self.config.name)
        log.info(
            "%s: %s key pair %s (public key %s)",
            self.config.name,
            "created" if created else "loaded",
            path,
            identity.public_key_hex[:16] + "...",
        )
        return identity

    def _publish(self, node: Node) -> None:
        if self.config.network_map is None:
            return
        network_map = NetworkMap(self.config.network_map)
        network_map.publish(
            NodeInfo(
                name=self.config.name,
                address=node.messaging.my_address,
                transport=_safe_url(self.config.transport_url),
                public_key=node.identity.public_key_hex,
            )
        )
        try:
            peers = sorted(set(network_map.nodes()) - {self.config.name})
        except NetworkMapError as error:
            log.warning("%s: %s", self.config.name, error)
            return
        log.info(
            "%s: network map %s lists %d peer(s): %s",
            self.config.name,
            network_map.directory,
            len(peers),
            "; ".join(peers) or "none yet",
        )

    def _serve(self) -> None:
        self._next_poll = 0.0
        next_status = 0.0
        next_report = time.monotonic() + REPORT_SECONDS
        while not self._stop.is_set():
            node = self.node
            assert node is not None
            node.wakeup.clear()
            try:
                worked = self._round(node)
            except LeaseLostError as error:
                self._on_lease_lost(error)
                break
            except NodeStopping as stopping:
                log.warning(
                    "%s: %s: interrupted it to stop; it resumes from its last checkpoint at the "
                    "next start",
                    self.config.name,
                    stopping,
                )
                break
            except Exception as error:
                self._recover(error)
                continue
            now = time.monotonic()
            if self.hospital.consecutive and now - self._last_failure > RECOVERED_AFTER_SECONDS:
                self.hospital.recovered()  # not after one good round: after a quiet while
            if now >= next_status:
                self._write_status(node, running=True)
                next_status = now + STATUS_SECONDS
            if now >= next_report:
                self._report(node)
                next_report = now + REPORT_SECONDS
            if not worked:
                node.wakeup.wait(self._idle_wait(node))

    def _round(self, node: Node) -> bool:
        """One scheduling round, plus operator commands and flow requests when due."""
        worked = node.run_once()
        now = time.monotonic()
        if now >= self._next_poll:
            if node.process_operator_requests():
                worked = True
            started = node.start_requested_flows()
            if started:
                log.info("%s: started %d requested flow(s)", self.config.name, started)
                worked = True
            self._next_poll = now + REQUEST_POLL_SECONDS
        return worked

    def _idle_wait(self, node: Node) -> float:
        wait = IDLE_WAIT_SECONDS
        deadline = node.next_deadline()
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - node.clock.now()))
        return wait

    def statistics(self, node: Node) -> dict[str, Any]:
        """The node's counters as a JSON-able dict."""
        stats = attrs.asdict(node.manager.statistics)
        stats.update(
            name=self.config.name,
            pid=os.getpid(),
            started_at=self._started_at,
            live_flows=len(node.manager.live_flows()),
            checkpoints_written=node.database.checkpoints.checkpoints_written,
            messages_sent=node.relay.handed_off,
            relay_waiting=node.relay.waiting(),
            relay_refused=node.relay.refused,
        )
        return stats

    def _report(self, node: Node) -> None:
        stats = self.statistics(node)
        if node.draining:
            log.info("%s: draining, %d flow(s) left", self.config.name, stats["live_flows"])
        log.info(
            "%s: %d live flows, %d completed, %d failed; %d messages in, %d out; "
            "%d checkpoints written",
            self.config.name,
            stats["live_flows"],
            stats["flows_completed"],
            stats["flows_failed"],
            stats["messages_received"],
            stats["messages_sent"],
            stats["checkpoints_written"],
        )

    def _write_status(self, node: Node, running: bool) -> None:
        path = self.config.status_file
        if path is None:
            return
        stats = self.statistics(node)
        stats["running"] = running
        temporary = path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(stats, indent=2) + "\n")
            temporary.replace(path)
        except OSError as error:  # a full disk or a removed directory must not stop the node
            log.warning("%s: cannot write the status file %s: %s", self.config.name, path, error)


def configure_logging(level: str) -> None:
    """Log lines with time, level and logger to stderr."""
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )


def run_node(config_path: str | Path) -> int:
    """``fiberflow node run``: load the config, run the node; returns the exit code."""
    try:
        config = load_config(config_path)
    except ConfigError as error:
        print(f"fiberflow node run: {error}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    return NodeProcess(config).run()


__all__ = [
    "ConfigError",
    "NodeProcess",
    "RuntimeConfig",
    "configure_logging",
    "load_config",
    "run_node",
]
