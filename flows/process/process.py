"""The node runtime: one node in its own process, from a TOML config file.

``fiberflow node run --config node.toml`` loads the config (:mod:`flows.config.runtime`),
builds a :class:`NodeProcess` and runs it until SIGTERM or SIGINT, then shuts down cleanly
(stop consuming, stop the relay, close the database; every flow stays checkpointed).

One process runs a node at a time: at start the process takes the node's lease
(:mod:`persistence.lease`) and renews it on a thread of its own. A second process on the same
node refuses to start with one line naming the holder (exit status 2). A process that loses
the lease (it was paused or cut off past its expiry and another took over) commits nothing
more and exits with status 3.

With an ``[rpc]`` section in its config the process also serves the node's HTTP API
(:mod:`flows.rpc`) on a thread, from when it holds the lease until it stops; an address in
use or a bad certificate is a start-up failure (exit status 2).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from flows.config.runtime import ConfigError, RuntimeConfig, load_config
from flows.network.identity import NetworkMapPeerKeys, NodeIdentity, load_or_create_identity
from flows.network.map import NetworkMap, NetworkMapError
from flows.network.trust import NetworkTrustError, NodeTrust
from flows.node.assembly import bridge_relay, build_node, node_transport
from flows.node.busy import BusyMonitor, BusyWatchdog, NodeStopping
from flows.node.hospital import RECOVERED_AFTER_SECONDS, Hospital
from flows.node.node import Node
from flows.process.gc_tuning import tune_collector
from foundation.engine import (
    application_name,
    first_line,
    is_permanent_connect_error,
    url_without_password,
)
from messaging.bridges import BridgeManager
from messaging.service import (
    TransportAuthenticationError,
    fatal_transport_error,
)
from messaging.tls import TlsSetupError
from persistence.lease import (
    LeaseError,
    LeaseHeldError,
    LeaseLostError,
    NodeLease,
    Rebalance,
    WorkerInfo,
)
from persistence.lease_keeper import LeaseKeeper
from persistence.migration import SchemaVersionError
from persistence.store import NodeDatabase
from statemachine.limits import WORKER_NAME_CHARS
from statemachine.partitions import partition_ranges

if TYPE_CHECKING:
    from flows.metrics import MetricsServer, NodeMetrics

log = logging.getLogger("fiberflow.runtime")

REQUEST_POLL_SECONDS = 0.05
"""How often an idle node looks for new flow requests."""
IDLE_WAIT_SECONDS = 0.05
STATUS_SECONDS = 1.0
REPORT_SECONDS = 10.0

EXIT_REFUSED = 2
"""Exit status of a node process that could not start (bad config, another holder)."""
EXIT_LEASE_LOST = 3
"""Exit status of a node process that lost its lease to another process."""


class NodeProcess:
    """Runs one node until asked to stop (see the module docstring)."""

    def __init__(self, config: RuntimeConfig, worker_name: str | None = None) -> None:
        """A process for the node ``config`` describes.

        With ``worker_name`` it is that worker of a node run by several workers (PostgreSQL
        only): it runs the flows of the partitions its lease holds, a fair share, handing
        partitions over and taking them as workers join and leave (:mod:`persistence.lease`).
        """
        self.config = config
        self.worker_name = worker_name
        self._rebalances: queue.SimpleQueue[Rebalance] = queue.SimpleQueue()
        """Partition changes the lease keeper found, for the serving loop to carry out."""
        self._stop = threading.Event()
        self.node: Node | None = None
        self.hospital = Hospital()
        self.recoveries = 0
        """Node-wide failures: rounds that failed and were resumed from the last checkpoints
        (failures pinned on a flow or a message are counted by ``hospital.pinned``)."""
        self._last_failure = 0.0
        self._next_poll = 0.0
        self._identity_cache: NodeIdentity | None = None
        self._identity_note = ""
        self.trust = NodeTrust()
        """The network root the node trusts and its certificate (loaded at start)."""
        self._started_at = time.time()
        self.worker = WorkerInfo.of_this_process(name=worker_name or "")
        """This process as a worker of the node (its id names its lease and consumer)."""
        self.lease: NodeLease | None = None
        self.busy = BusyMonitor()
        """Which flow's code runs now, across rebuilds of the node (the watchdog reads it)."""
        self._watchdog: BusyWatchdog | None = None
        self.lease_lost: LeaseLostError | None = None
        """Set when the lease was lost: the process stops and exits with status 3."""
        self.refused: TransportAuthenticationError | None = None
        """Set when the transport refused the node's login while it ran: the process stops
        and exits with status 2 (retrying cannot help)."""
        self.metrics: NodeMetrics | None = None
        """The node's Prometheus metrics, with the config's ``[metrics]`` (across rebuilds)."""
        self.metrics_server: MetricsServer | None = None
        """The HTTP server serving them, while the process runs."""
        self.rpc_server: Any = None
        """The API server (:class:`flows.rpc.server.RpcServer`) while it serves, else None."""
        self.metrics_app: Any = None
        """An ASGI app the API serves at ``/metrics`` (set before :meth:`run`), or None."""

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
        if config.rpc is not None:
            problem = config.rpc.worker_problem(self.worker_name)
            if problem is not None:
                log.error("%s: %s; refusing to start", config.name, problem)
                return EXIT_REFUSED
        self._identity_cache = self._identity()
        try:
            self.trust = NodeTrust.load(
                config.network_root, config.certificate, self._identity_cache
            )
        except NetworkTrustError as error:
            log.error("%s: %s; refusing to start", config.name, error)
            return EXIT_REFUSED
        try:
            config.tls_settings().context()  # the TLS files load, before anything connects
        except TlsSetupError as error:
            log.error("%s: %s; refusing to start", config.name, error)
            return EXIT_REFUSED
        if not self._serve_metrics():
            return EXIT_REFUSED
        try:
            return self._run_serving_metrics()
        finally:
            if self.metrics_server is not None:
                self.metrics_server.close()
                self.metrics_server = None

    def _serve_metrics(self) -> bool:
        """Serve the metrics if the config has ``[metrics]``; False if the port is taken.

        ``prometheus_client`` is imported here, only when metrics are configured.
        """
        settings = self.config.metrics
        if settings is None:
            return True
        from flows.metrics import MetricsServerError, NodeMetrics, serve_metrics

        self.metrics = NodeMetrics()
        try:
            self.metrics_server = serve_metrics(self.metrics, settings.address, settings.port)
        except MetricsServerError as error:
            log.error("%s: %s; refusing to start", self.config.name, error)
            return False
        log.info(
            "%s: metrics at http://%s:%d/metrics",
            self.config.name,
            settings.address,
            self.metrics_server.port,
        )
        return True

    def _run_serving_metrics(self) -> int:
        config = self.config
        lease_database = self._open_database()
        if lease_database is None:
            return EXIT_REFUSED
        try:
            shared = self.worker_name is not None
            lease = lease_database.new_lease(self.worker, config.lease_seconds, shared=shared)
            try:
                lease.acquire()
            except LeaseHeldError as error:
                log.error("%s: %s", config.name, error)
                return EXIT_REFUSED
            except LeaseError as error:  # (workers asked of a node database on SQLite)
                log.error("%s: %s; refusing to start", config.name, error)
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
            try:
                serving = self._start_rpc()  # before any line is logged: a failure is one line
            except BaseException:
                lease.release()
                raise
            if not serving:
                lease.release()
                return EXIT_REFUSED
            keeper = LeaseKeeper(
                lease,
                self._on_lease_lost,
                config.name,
                on_rebalance=self._on_rebalance if shared else None,
            )
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
                self._stop_rpc()
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
        url = url_without_password(config.database_url)
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
            except SchemaVersionError as error:
                log.error("%s: %s; refusing to start", config.name, error)
                return None
            except (SQLAlchemyError, OSError) as error:
                problem = first_line(error)
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

    def _on_rebalance(self, change: Rebalance) -> None:
        """From the lease keeper's thread: the serving loop carries the change out."""
        self._rebalances.put(change)
        node = self.node
        if node is not None:
            node.wakeup.set()

    def _apply_rebalances(self) -> None:
        """Carry out the partition changes the lease keeper found (on the serving thread).

        The node is stopped (its flows stay checkpointed; the transport gives back what it
        held unsettled), the partitions to hand over are released, and the node is built
        again on the partitions the lease holds now: flows of taken partitions are restored
        lazily, as at any start.
        """
        to_release: set[int] = set()
        while True:
            try:
                change = self._rebalances.get_nowait()
            except queue.Empty:
                break
            to_release |= change.to_release
        lease = self.lease
        assert lease is not None and self.node is not None
        before = self.node.partitions or frozenset()
        self.node.stop()
        lease.release_partitions(to_release)
        self._build_node()
        after = self.node.partitions or frozenset()
        log.info(
            "%s: worker %r now runs partitions %s (handed over %s, took %s)",
            self.config.name,
            self.worker_name,
            partition_ranges(after),
            partition_ranges(before - after),
            partition_ranges(after - before),
        )

    def _run_holding_lease(self, lease: NodeLease) -> int:
        config = self.config
        # The node-info first: the node's start re-sends its outbox, and a peer verifies
        # those messages by the keys on the map (an older entry it refuses, say one published
        # before an upgrade or with a lapsed certificate, would have them dead-lettered).
        map_note = self._publish()
        node = self._build_node()
        log.info("%s", self._identity_note)
        if map_note is not None:
            log.info("%s", map_note)
        tune_collector()  # after start-up: what it built is frozen (flows/process/gc_tuning.py)
        log.info(
            "%s: started (pid %d, worker %s, lease epoch %d): %d flows restored from %s, %d "
            "outbox messages re-sent; transport %s; cordapps %s",
            config.name,
            os.getpid(),
            self.worker.describe() if self.worker_name else self.worker.worker_id[:8],
            max(lease.epochs.values(), default=0),
            node.restored_flows,
            url_without_password(config.database_url),
            node.resent_messages,
            url_without_password(config.transport_url),
            ", ".join(config.cordapps) or "none",
        )
        log.info("%s: amqps:// connections: %s", config.name, config.tls_settings().describe())
        try:
            self._serve()
        finally:
            final = self.node
            assert final is not None
            self._write_status(final, running=False)
            final.stop()
            if self.lease_lost is None and self.refused is None:
                log.info("%s: stopped cleanly; every unfinished flow is checkpointed", config.name)
        if self.lease_lost is not None:
            return EXIT_LEASE_LOST
        return EXIT_REFUSED if self.refused is not None else 0

    def _start_rpc(self) -> bool:
        """Serve the API if the config asks for it; False (logged) if it cannot be served."""
        rpc = self.config.rpc
        if rpc is None:
            return True
        port = rpc.port_for(self.worker_name)
        if port is None:
            log.info(
                "%s: worker %r serves no API (rpc.worker_ports does not name it)",
                self.config.name,
                self.worker_name,
            )
            return True
        from flows.rpc.service import RpcStartError, start_rpc_server

        assert self._identity_cache is not None
        if self.metrics_app is None and self.metrics is not None:  # [metrics] too: at /metrics
            from flows.metrics import metrics_asgi_app

            self.metrics_app = metrics_asgi_app(self.metrics)
        try:
            self.rpc_server = start_rpc_server(
                self.config,
                port,
                mac_key=self._identity_cache.mac_key(),
                ready=self._ready,
                process_info=self._process_info,
                metrics_app=self.metrics_app,
            )
        except RpcStartError as error:
            log.error("%s: %s; refusing to start", self.config.name, error)
            return False
        return True

    def _stop_rpc(self) -> None:
        if self.rpc_server is not None:
            self.rpc_server.stop()
            self.rpc_server = None

    def _ready(self) -> bool:
        """True while the process holds the node's lease and serves (``GET /ready``)."""
        lease = self.lease
        return (
            self.node is not None
            and lease is not None
            and lease.held
            and self.lease_lost is None
            and not self._stop.is_set()
        )

    def _process_info(self) -> dict[str, Any]:
        """What ``GET /api/node`` says of this process."""
        node, lease = self.node, self.lease
        partitions: str | None = None  # not running
        if node is not None:
            partitions = "all" if node.partitions is None else partition_ranges(node.partitions)
        return {
            "pid": os.getpid(),
            "worker": self.worker_name,
            "worker_id": self.worker.worker_id,
            "started_at": self._started_at,
            "lease_held": bool(lease is not None and lease.held and self.lease_lost is None),
            "lease_epoch": max(lease.epochs.values(), default=0) if lease is not None else None,
            "partitions": partitions,
            "topology": self.config.topology,
        }

    def _refused_by_transport(self, error: TransportAuthenticationError) -> None:
        """The transport refused the node's login: stop (every flow stays checkpointed)."""
        if self.refused is None:
            self.refused = error
            log.error(
                "%s: %s; stopping the node (every unfinished flow is checkpointed): fix the "
                "credentials in transport_url and start it again",
                self.config.name,
                error,
            )
        self.request_stop()

    def _check_transport(self, node: Node) -> bool:
        """False (and the node stopping) if its transport can no longer work."""
        error = fatal_transport_error(node.messaging)
        if error is None:
            return True
        self._refused_by_transport(error)
        return False

    def _build_node(self) -> Node:
        """A node from the config, started: flows restored, flows kept in the hospital kept."""
        config = self.config
        assert self._identity_cache is not None
        network_map = NetworkMap(config.network_map or Path("network-map"), self.trust.root)
        node = build_node(
            config.node_config(),
            node_transport(config, self.worker.worker_id),
            identity=self._identity_cache,
            peers=NetworkMapPeerKeys(network_map),
            background_relay=True,
            lease=self.lease,
            hospital=self.hospital,
            busy=self.busy,
            relay_factory=bridge_relay(config, network_map) if config.topology == "p2p" else None,
            instruments=None if self.metrics is None else self.metrics.instruments(),
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
            except TransportAuthenticationError as refused:
                self._refused_by_transport(refused)
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
        self._identity_note = (
            f"{self.config.name}: {'created' if created else 'loaded'} key pair {path} (public "
            f"key {identity.public_key_hex[:16]}...)"
        )  # logged once the node has its database: a failed start stays one line
        return identity

    def _publish(self) -> str | None:
        """Publish the node's node-info; returns what to log of the map once the node runs."""
        if self.config.network_map is None:
            return None
        identity = self._identity_cache
        assert identity is not None
        network_map = NetworkMap(self.config.network_map, self.trust.root)
        info = self.config.node_info(identity, self.trust.certificate)
        network_map.publish(info, identity=identity)
        try:
            peers = sorted(set(network_map.nodes()) - {self.config.name})
        except NetworkMapError as error:
            log.warning("%s: %s", self.config.name, error)
            return None
        return (
            f"{self.config.name}: network map {network_map.directory} lists {len(peers)} "
            f"peer(s): {'; '.join(peers) or 'none yet'}"
        )

    def _serve(self) -> None:
        self._next_poll = 0.0
        self._next_counts = 0.0
        next_status = 0.0
        next_report = time.monotonic() + REPORT_SECONDS
        while not self._stop.is_set():
            try:
                if not self._rebalances.empty():
                    self._apply_rebalances()
            except LeaseLostError as error:
                self._on_lease_lost(error)
                break
            except Exception as error:
                self._recover(error)
                continue
            node = self.node
            assert node is not None
            if not self._check_transport(node):
                break
            node.wakeup.clear()
            try:
                worked = self._round(node)
            except LeaseLostError as error:
                self._on_lease_lost(error)
                break
            except TransportAuthenticationError as refused:
                self._refused_by_transport(refused)
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
            fired = node.fire_schedules()
            if fired:
                log.info("%s: %d scheduled flow(s) due", self.config.name, fired)
            started = node.start_requested_flows()
            if started:
                log.info("%s: started %d requested flow(s)", self.config.name, started)
                worked = True
            if now >= self._next_counts:  # a fenced write, at most once a second, on change
                node.publish_flow_counts()
                self._next_counts = now + STATUS_SECONDS
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
        counts = node.manager.flow_counts()
        stats.update(
            name=self.config.name,
            pid=os.getpid(),
            started_at=self._started_at,
            live_flows=counts.live,
            flows_in_memory=counts.in_memory,
            flows_dormant=counts.dormant,
            flows_restoring=counts.restoring,
            waiting_in_memory=counts.waiting_in_memory,
            checkpoints_written=node.database.checkpoints.checkpoints_written,
            messages_sent=node.relay.handed_off,
            relay_waiting=node.relay.waiting(),
            relay_refused=node.relay.refused,
            topology=self.config.topology,
            worker=self.worker_name,
            worker_id=self.worker.worker_id,
            partitions=None if node.partitions is None else sorted(node.partitions),
        )
        if isinstance(node.relay, BridgeManager):
            stats["bridges"] = [attrs.asdict(bridge) for bridge in node.relay.status()]
        return stats

    def _report(self, node: Node) -> None:
        stats = self.statistics(node)
        if node.draining:
            log.info("%s: draining, %d flow(s) left", self.config.name, stats["live_flows"])
        log.info(
            "%s: %d live flows (%d hibernated or not restored yet), %d completed, %d failed; "
            "%d messages in, %d out; %d checkpoints written",
            self.config.name,
            stats["live_flows"],
            stats["flows_dormant"],
            stats["flows_completed"],
            stats["flows_failed"],
            stats["messages_received"],
            stats["messages_sent"],
            stats["checkpoints_written"],
        )

    @property
    def status_path(self) -> Path | None:
        """Where this process writes its status: the config's ``status_file``.

        A worker writes its own beside it, its name after the first part of the file's
        (``alice.status.json``: ``alice.w1.status.json``).
        """
        path = self.config.status_file
        if path is None or self.worker_name is None:
            return path
        return worker_status_path(path, self.worker_name)

    def _write_status(self, node: Node, running: bool) -> None:
        path = self.status_path
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


def worker_status_path(path: Path, worker: str) -> Path:
    """The status file of worker ``worker`` of a node whose config names ``path``."""
    head, dot, rest = path.name.partition(".")
    return path.with_name(f"{head}.{worker}{dot}{rest}")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""The levels ``log_level`` and ``--log-level`` take."""
CHATTY_LIBRARIES = ("pika", "alembic")
"""Libraries whose INFO lines (every connection step; Alembic's at every schema check) are
shown only at DEBUG."""
CONNECTION_FAILURE_LOGGERS = (
    "pika.adapters.blocking_connection",
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.utils.io_services_utils",
    "pika.connection",
)
"""pika's loggers that report a failed connection attempt in ten ERROR lines and a traceback:
shown only at DEBUG, since fiberflow reports each attempt (and a final failure) in one line."""


def configure_logging(level: str) -> None:
    """Log lines with time, level and logger to stderr, at ``level`` (one of LOG_LEVELS).

    The chatty libraries log at WARNING and above unless ``level`` is DEBUG. (Like
    ``logging.basicConfig``, it leaves a root logger that already has handlers alone.)
    """
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    quiet = logging.DEBUG if level == "DEBUG" else max(logging.WARNING, getattr(logging, level))
    for library in CHATTY_LIBRARIES:
        logging.getLogger(library).setLevel(quiet)
    silent = logging.DEBUG if level == "DEBUG" else logging.CRITICAL
    for name in CONNECTION_FAILURE_LOGGERS:
        logging.getLogger(name).setLevel(silent)


def run_node(
    config_path: str | Path, worker: str | None = None, log_level: str | None = None
) -> int:
    """``fiberflow node run``: load the config, run the node; returns the exit code.

    With ``worker``, as that worker of a node run by several workers (PostgreSQL only).
    ``log_level`` (the command line's ``--log-level``) overrides the config's ``log_level``.
    """
    problem = None if worker is None else worker_name_problem(worker)
    if problem is not None:
        print(f"fiberflow node run: --worker: {problem}", file=sys.stderr)
        return 2
    try:
        config = load_config(config_path)
    except ConfigError as error:
        print(f"fiberflow node run: {error}", file=sys.stderr)
        return 2
    configure_logging(log_level or config.log_level)
    try:
        return NodeProcess(config, worker_name=worker).run()
    except Exception as error:  # a start-up failure: one line; the traceback at DEBUG only
        log.debug("%s: the node could not start", config.name, exc_info=True)
        print(f"fiberflow node run: {config.name}: {startup_problem(error)}", file=sys.stderr)
        return EXIT_REFUSED


def startup_problem(error: BaseException) -> str:
    """One line saying why a command could not start: the error's class and first line.

    (Run with ``--log-level DEBUG`` for the traceback.)
    """
    return f"{type(error).__name__}: {first_line(error)}"


def worker_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a worker, or None."""
    if not name or len(name) > WORKER_NAME_CHARS:
        return f"a worker's name has 1 to {WORKER_NAME_CHARS} characters"
    if not all(c.isalnum() or c in "-_." for c in name):
        return f"{name!r}: a worker's name has letters, digits, '-', '_' and '.' only"
    return None


__all__ = [
    "ConfigError",
    "NodeProcess",
    "RuntimeConfig",
    "LOG_LEVELS",
    "configure_logging",
    "load_config",
    "run_node",
]
