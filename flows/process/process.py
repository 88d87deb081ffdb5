"""A node in its own process: :class:`NodeProcess`, its lifecycle, signals and serving loop.

``fiberflow node run --config node.toml`` (:mod:`flows.process.command`) loads the config
(:mod:`flows.config.runtime`), builds a :class:`NodeProcess` and runs it until SIGTERM or
SIGINT, then shuts down cleanly (stop consuming, stop the relay, close the database; every
flow stays checkpointed). Its parts: the node kept running across failures and rebalances
(:mod:`flows.process.node_keeper`), the servers beside it (:mod:`flows.process.side_servers`),
its status (:mod:`flows.process.status`) and the wait for its database
(:mod:`flows.process.database_wait`).

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

import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import OperationalError

from flows.config.runtime import ConfigError, RuntimeConfig
from flows.network.identity import NetworkMapPeerKeys, NodeIdentity, load_or_create_identity
from flows.network.map import NetworkMap, NetworkMapError
from flows.network.trust import NetworkTrustError, NodeTrust
from flows.node.assembly import bridge_relay, build_node, node_transport
from flows.node.busy import BusyMonitor, BusyWatchdog, NodeStopping
from flows.node.hospital import RECOVERED_AFTER_SECONDS, Hospital
from flows.node.node import Node
from flows.process.database_wait import open_node_database
from flows.process.gc_tuning import tune_collector
from flows.process.node_keeper import NodeKeeper
from flows.process.side_servers import SideServers
from flows.process.status import ProcessStatus
from foundation.engine import (
    url_without_password,
)
from messaging.service import (
    TransportAuthenticationError,
    fatal_transport_error,
)
from messaging.tls import TlsSetupError
from persistence.lease import LeaseError, LeaseHeldError, LeaseLostError, NodeLease
from persistence.lease_keeper import LeaseKeeper
from persistence.worker_process import WorkerInfo
from statemachine.partitions import partition_ranges

if TYPE_CHECKING:
    from flows.metrics import MetricsServer

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
        self._stop = threading.Event()
        self.hospital = Hospital()
        self._next_poll = 0.0
        self._next_counts = 0.0
        self._identity_cache: NodeIdentity | None = None
        self._identity_note = ""
        self.trust = NodeTrust()
        """The network root the node trusts and its certificate (loaded at start)."""
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
        self.servers = SideServers(config, worker_name)
        """The metrics and API servers beside the node, when the config asks for them."""
        self.status = ProcessStatus(config, worker_name, self.worker, time.time())
        """The process's statistics, status file and report."""
        self.keeper = NodeKeeper(
            config.name,
            self._new_node,
            self.hospital,
            self._stop,
            self._on_lease_lost,
            self._refused_by_transport,
            worker_name,
        )
        """The node, started, rebuilt after node-wide failures and on rebalances."""

    @property
    def node(self) -> Node | None:
        """The node now running (None before it starts)."""
        return self.keeper.node

    @property
    def recoveries(self) -> int:
        """Node-wide failures the process recovered from (see :class:`NodeKeeper`)."""
        return self.keeper.recoveries

    @property
    def rpc_server(self) -> Any:
        """The API server (:class:`flows.rpc.server.RpcServer`) while it serves, else None."""
        return self.servers.rpc_server

    @property
    def metrics_server(self) -> MetricsServer | None:
        """The metrics' own HTTP server while the process runs, else None."""
        return self.servers.metrics_server

    @property
    def status_path(self) -> Path | None:
        """Where this process writes its status (see :attr:`ProcessStatus.status_path`)."""
        return self.status.status_path

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
        if not self.servers.serve_metrics():
            return EXIT_REFUSED
        try:
            return self._run_serving_metrics()
        finally:
            self.servers.stop_metrics()

    def _run_serving_metrics(self) -> int:
        config = self.config
        lease_database = open_node_database(config, self.worker.worker_id, self._stop)
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
                assert self._identity_cache is not None
                serving = self.servers.start_rpc(  # before any line is logged: one line if not
                    self._identity_cache.mac_key(), self._ready, self._process_info
                )
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
                on_rebalance=self.keeper.on_rebalance if shared else None,
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
                self.servers.stop_rpc()
                watchdog.close()
                self._watchdog = None
                keeper.stop()
                if self.lease_lost is None:
                    lease.release()
        finally:
            lease_database.close()

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
        # The node-info first: the node's start re-sends its outbox, and a peer verifies
        # those messages by the keys on the map (an older entry it refuses, say one published
        # before an upgrade or with a lapsed certificate, would have them dead-lettered).
        map_note = self._publish()
        node = self.keeper.start()
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
            self.status.write(final, running=False)
            final.stop()
            if self.lease_lost is None and self.refused is None:
                log.info("%s: stopped cleanly; every unfinished flow is checkpointed", config.name)
        if self.lease_lost is not None:
            return EXIT_LEASE_LOST
        return EXIT_REFUSED if self.refused is not None else 0

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
            "started_at": self.status.started_at,
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

    def _new_node(self) -> Node:
        """A node from the config, on the transport it names, built (the keeper starts it)."""
        config = self.config
        assert self._identity_cache is not None
        network_map = NetworkMap(config.network_map or Path("network-map"), self.trust.root)
        metrics = self.servers.metrics
        return build_node(
            config.node_config(),
            node_transport(config, self.worker.worker_id),
            identity=self._identity_cache,
            peers=NetworkMapPeerKeys(network_map),
            background_relay=True,
            lease=self.lease,
            hospital=self.hospital,
            busy=self.busy,
            relay_factory=bridge_relay(config, network_map) if config.topology == "p2p" else None,
            instruments=None if metrics is None else metrics.instruments(),
        )

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
        keeper = self.keeper
        self._next_poll = 0.0
        self._next_counts = 0.0
        next_status = 0.0
        next_report = time.monotonic() + REPORT_SECONDS
        while not self._stop.is_set():
            try:
                if keeper.rebalance_due:
                    assert self.lease is not None
                    keeper.apply_rebalances(self.lease)
            except LeaseLostError as error:
                self._on_lease_lost(error)
                break
            except Exception as error:
                keeper.recover(error)
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
                keeper.recover(error)
                continue
            now = time.monotonic()
            if self.hospital.consecutive and now - keeper.last_failure > RECOVERED_AFTER_SECONDS:
                self.hospital.recovered()  # not after one good round: after a quiet while
            if now >= next_status:
                self.status.write(node, running=True)
                next_status = now + STATUS_SECONDS
            if now >= next_report:
                self.status.report(node)
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


__all__ = ["EXIT_LEASE_LOST", "EXIT_REFUSED", "NodeProcess"]
