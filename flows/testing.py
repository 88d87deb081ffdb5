"""``MockNetwork``: several nodes in one process, on the in-memory network, for tests.

Each node has its own SQLite file (in a temporary directory unless you give one), so
``restart()`` is a real crash-and-recover: every in-memory object of the node is dropped,
the messages it had not acknowledged go back to its queue, and a new node is built from
its database. Nothing runs until you call :meth:`MockNetwork.run_network`, which pumps every
node and the network until nothing is left to do (advancing the mock clock to the next timer
when that is all that is left, unless told not to).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from flows.config.node import DEFAULT_RECEIVE_TIMEOUT, NodeConfig
from flows.flow_logic import FlowLogic
from flows.network.identity import NodeIdentity, StaticPeerKeys
from flows.node.assembly import build_node
from flows.node.handles import FlowHandle
from flows.node.hospital import Hospital
from flows.node.node import Node
from flows.party import Party
from foundation.engine import drop_schema
from foundation.serialization import DEFAULT_LIMITS, SerializationLimits, qualified_name
from messaging.inmemory import Faults, InMemoryNetwork
from persistence.memory_store import MEMORY_URL
from statemachine.executor import AFTER_COMMIT_ORDER, IN_TRANSACTION_ORDER
from statemachine.state import FlowStatus

if TYPE_CHECKING:
    from flows.metrics import NodeMetrics

T = TypeVar("T")

DEFAULT_START_TIME = 1_800_000_000.0


class MockClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = DEFAULT_START_TIME) -> None:
        self._now = start

    def now(self) -> float:
        """The current mock time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("time only moves forward")
        self._now += seconds

    def advance_to(self, moment: float) -> None:
        """Move time forward to ``moment`` (no-op if it is in the past)."""
        self._now = max(self._now, moment)


class SimulatedCrash(BaseException):
    """Raised at an armed crash point: the node "dies" there (see ``MockNode.crash_at``).

    A ``BaseException``, like ``KeyboardInterrupt``: nothing that recovers from errors
    (the flow hospital, failure isolation) may catch it, as nothing survives a real crash.
    """


class NetworkNotQuiescentError(RuntimeError):
    """``run_network`` hit its round limit with work still to do."""


CRASH_POINTS: tuple[str, ...] = (
    "before_transaction",
    *(f"after_{kind.__name__}" for kind in IN_TRANSACTION_ORDER),
    "after_commit",
    *(f"after_{kind.__name__}" for kind in AFTER_COMMIT_ORDER),
    "after_hand_off",
    "after_outbox_delete",
    "flow_suspended",
    "during_replay",
)
"""Every point :meth:`MockNode.crash_at` can crash a node at: the executor's action
boundaries (before the transaction, after each kind of action in it, after the commit, after
each kind of action after it), the relay's (after a hand-off, after deleting sent rows), and
the fibers' (every suspension; a suspension answered from the journal during a replay)."""


class MockNode:
    """A node of a :class:`MockNetwork`."""

    def __init__(
        self, network: MockNetwork, config: NodeConfig, metrics: NodeMetrics | None = None
    ) -> None:
        self._network = network
        self.config = config
        self.metrics = metrics
        """The node's Prometheus metrics, if it was created with them (kept across restarts)."""
        self.party = Party(config.name)
        self.boundary_counts: Counter[str] = Counter()
        self.crashes = 0
        self.identity = NodeIdentity.generate(config.name)
        """The node's key pair (kept across restarts, as its key file would be)."""
        network.peer_keys.add(config.name, self.identity.public_key, self.identity.agreement_key)
        self.hospital: Hospital | None = Hospital(seed=0) if network.hospital else None
        """The node's flow hospital (``MockNetwork(hospital=True)``), else None: errors
        propagate out of ``run_network`` for the test to see."""
        self._armed: tuple[str, int] | None = None
        self.node = self._build()

    @property
    def name(self) -> str:
        """The node's X.500 name."""
        return self.config.name

    def crash_at(self, point: str, nth: int = 1) -> None:
        """Arm a crash: the ``nth`` time from now this node reaches ``point``, it dies.

        Points are the executor's action boundaries (``before_transaction``,
        ``after_PersistCheckpoint``, ``after_RecordInboundMessages``, ``after_WriteOutbox``,
        ``after_commit``, ``after_AcknowledgeMessages``, ``after_HandOffMessages``, ...), the
        relay's ``after_hand_off`` and ``after_outbox_delete``, ``flow_suspended`` (every
        suspension of a flow) and ``during_replay`` (a suspension answered from the journal
        while a restored flow replays). Dying
        means: the open transaction is rolled back, everything in memory is dropped, and the
        network restarts the node from its database. ``boundary_counts`` tells how often each
        point was reached.
        """
        if nth < 1:
            raise ValueError("nth counts from 1")
        if point not in CRASH_POINTS:
            raise ValueError(
                f"no crash point {point!r} (it would never fire); the points are: "
                + ", ".join(CRASH_POINTS)
            )
        self._armed = (point, nth)
        self.boundary_counts.clear()

    def disarm(self) -> tuple[str, int] | None:
        """Cancel the armed crash (if any); returns what was armed."""
        armed, self._armed = self._armed, None
        return armed

    @contextlib.contextmanager
    def crashes_paused(self) -> Iterator[None]:
        """No armed crash fires inside this block (the arming, and the counts, stay)."""
        armed = self.disarm()
        try:
            yield
        finally:
            if armed is not None and self._armed is None:
                self._armed = armed

    def _on_boundary(self, point: str) -> None:
        self.boundary_counts[point] += 1
        if self._armed == (point, self.boundary_counts[point]):
            self._armed = None
            raise SimulatedCrash(f"{self.name} crashed at {point}")

    def _build(self) -> Node:
        while True:
            endpoint = self._network.messaging.endpoint(self.config.name)
            node = build_node(
                self.config,
                endpoint,
                clock=self._network.clock,
                on_boundary=self._on_boundary,
                identity=self.identity,
                peers=self._network.peer_keys,
                hospital=self.hospital,
                instruments=None if self.metrics is None else self.metrics.instruments(),
            )
            try:
                node.start()
            except SimulatedCrash:
                node.stop()
                self.crashes += 1
                continue
            return node

    def run_once(self) -> bool:
        """Deliver this node's queued messages and run one round; a crash restarts it."""
        try:
            delivered = self._network.messaging.deliver(self.name) > 0
            return self.node.run_once() or delivered
        except SimulatedCrash:
            self.crashes += 1
            self.restart()
            return True

    def run_round(self) -> bool:
        """Run one round on what the node was already handed (nothing more is delivered).

        With :meth:`InMemoryNetwork.deliver_one` a test decides message by message what the
        node sees. A crash restarts the node, as in :meth:`run_once`.
        """
        try:
            return self.node.run_once()
        except SimulatedCrash:
            self.crashes += 1
            self.restart()
            return True

    def start_flow(self, flow: FlowLogic[T]) -> FlowHandle[T]:
        """Start ``flow`` on this node; it runs when the network runs.

        The handle keeps working across ``restart()`` (it asks whichever node is current).
        If an armed crash fires while the start commits, the node restarts and the
        :class:`SimulatedCrash` reaches the caller, as a lost reply would reach an RPC client.
        """
        try:
            return FlowHandle(self, self.node.start_flow(flow).flow_id)
        except SimulatedCrash:
            self.crashes += 1
            self.restart()
            raise

    def start_flows(self, flows: Sequence[FlowLogic[T]]) -> list[FlowHandle[T]]:
        """Start several flows in one transaction (see ``Node.start_flows``)."""
        try:
            started = self.node.start_flows(flows)
        except SimulatedCrash:
            self.crashes += 1
            self.restart()
            raise
        return [FlowHandle(self, handle.flow_id) for handle in started]

    def kill_flow(self, flow_id: str, reason: str = "killed by an operator") -> None:
        """See ``Node.kill_flow``."""
        self.node.kill_flow(flow_id, reason)

    def pause_flow(self, flow_id: str) -> None:
        """See ``Node.pause_flow``."""
        self.node.pause_flow(flow_id)

    def resume_flow(self, flow_id: str) -> None:
        """See ``Node.resume_flow``."""
        self.node.resume_flow(flow_id)

    def retry_flow(self, flow_id: str) -> None:
        """See ``Node.retry_flow``."""
        self.node.retry_flow(flow_id)

    def flow_handle(self, flow_id: str) -> FlowHandle[Any]:
        """The handle of a flow started on this node (also after a restart)."""
        self.node.flow_status(flow_id)  # raises KeyError for an unknown id
        return FlowHandle(self, flow_id)

    def flow_result(self, flow_id: str) -> Any:
        """The result of a flow of this node (see ``Node.flow_result``)."""
        return self.node.flow_result(flow_id)

    def completed_flows(self, flow_class: type[FlowLogic[Any]] | None = None) -> list[str]:
        """Ids of this node's flows that finished with a result (of ``flow_class`` only, if given).

        Oldest first. Crash tests use it to show a flow finished exactly once: a responder
        the node started twice would have two ids here (``flow_result(id)`` gives each
        result).
        """
        name = None if flow_class is None else qualified_name(flow_class)
        return self.node.database.checkpoints.completed_flow_ids(name)

    def checkpoints(self) -> list[tuple[str, str, str]]:
        """(flow id, flow class, status) of every flow with a stored checkpoint."""
        return self.node.checkpoints()

    def restart(self) -> None:
        """Crash and recover: drop everything in memory and rebuild from the database.

        (On the non-durable ``database="memory"`` store a restart forgets every flow.)
        """
        self.node.stop()
        self.node = self._build()

    def flow_status(self, flow_id: str) -> FlowStatus:
        """The status of a flow of this node."""
        return self.node.flow_status(flow_id)

    def __repr__(self) -> str:
        return f"MockNode({self.name})"


def check_mock_database(database: str) -> str:
    """``database`` if a mock node can be kept there, else a ValueError naming what can."""
    if database not in ("sqlite", "memory") and not database.startswith("postgres"):
        raise ValueError(
            "database must be 'sqlite', 'memory' (not durable) or a postgresql:// URL, "
            f"not {database!r}"
        )
    return database


class MockNetwork:
    """Nodes on an in-memory network, driven step by step.

    ``database`` is ``"sqlite"`` (a file per node, the default), ``"memory"`` (not durable:
    "checkpoints off") or a ``postgresql://`` URL (a schema per node, dropped by
    :meth:`stop_nodes`).
    """

    def __init__(
        self,
        cordapps: Sequence[str] = (),
        *,
        seed: int = 0,
        faults: Faults | None = None,
        directory: str | Path | None = None,
        synchronous: str = "NORMAL",
        database: str = "sqlite",
        receive_timeout: float | None = DEFAULT_RECEIVE_TIMEOUT,
        hospital: bool = False,
        operation_threads: int = 16,
        hibernate_after: float | None = None,
    ) -> None:
        check_mock_database(database)
        self.database = database
        self.receive_timeout = receive_timeout
        self.operation_threads = operation_threads
        self.hibernate_after = hibernate_after
        """Each node's ``NodeConfig.hibernate_after``: None (the default here) keeps every
        waiting flow in memory; 0 hibernates each as soon as its round commits."""
        """Each node's threads for external operations (``NodeConfig.operation_threads``)."""
        self.hospital = hospital
        """With True each node has a flow hospital, as a node process does: failures pinned
        on a flow or a message are retried, kept or quarantined (on the mock clock) while
        the other flows go on. With False (the default) they propagate to the test."""
        self._schema_prefix = f"ff_{uuid.uuid4().hex[:12]}"
        self._schemas: list[tuple[str, str]] = []
        """(PostgreSQL URL, schema) of every node kept in a schema, dropped by stop_nodes."""
        self.cordapps = tuple(cordapps)
        self.messaging = InMemoryNetwork(seed, faults)
        self.peer_keys = StaticPeerKeys()
        """Every node's public and agreement keys (the test network's network map)."""
        self.clock = MockClock()
        self.synchronous = synchronous
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="fiberflow-mock-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.nodes: list[MockNode] = []

    def create_node(
        self,
        name: str,
        cordapps: Sequence[str] | None = None,
        *,
        limits: SerializationLimits = DEFAULT_LIMITS,
        metrics: NodeMetrics | None = None,
        database: str | None = None,
    ) -> MockNode:
        """Add a node called ``name`` (an X.500 name such as ``O=Alice,L=London,C=GB``).

        ``limits`` bound its payloads and session messages (``NodeConfig.limits``);
        ``metrics`` (:class:`flows.metrics.NodeMetrics`) are fed by the node and its restarts.
        ``database`` keeps this node elsewhere than the network's ``database`` (same values:
        ``"sqlite"``, ``"memory"`` or a ``postgresql://`` URL), for a network whose nodes
        are on SQLite and PostgreSQL alike.
        """
        if any(node.name == name for node in self.nodes):
            raise ValueError(f"the network already has a node called {name}")
        store = self.database if database is None else check_mock_database(database)
        party = Party(name)
        filename = "".join(ch if ch.isalnum() else "_" for ch in party.organisation)
        path = self.directory / f"{filename}_{len(self.nodes)}.db"
        schema_name = None
        if store == "sqlite":
            url = f"sqlite:///{path}"
        elif store == "memory":
            url = MEMORY_URL
        else:
            url = store
            schema_name = f"{self._schema_prefix}_{len(self.nodes)}"
            self._schemas.append((store, schema_name))
        config = NodeConfig(
            name=name,
            database_url=url,
            database_schema=schema_name,
            cordapps=tuple(self.cordapps if cordapps is None else cordapps),
            synchronous=self.synchronous,
            receive_timeout=self.receive_timeout,
            limits=limits,
            operation_threads=self.operation_threads,
            hibernate_after=self.hibernate_after,
        )
        node = MockNode(self, config, metrics)
        self.nodes.append(node)
        return node

    def run_once(self) -> bool:
        """Deliver queued messages to every node and run one round on each; True if busy."""
        busy = False
        for mock in self.nodes:
            if mock.run_once():
                busy = True
        return busy

    def run_network(
        self,
        max_rounds: int = 100_000,
        advance_clock: bool = True,
        operation_wait: float = 30.0,
    ) -> int:
        """Run until no node and no message has anything left to do; returns the rounds run.

        While flows' external operations run (on real threads), it waits up to
        ``operation_wait`` real seconds for one to end before it looks at timers. When only
        timers are left, the mock clock jumps to the earliest one (unless ``advance_clock``
        is False, in which case the network stops there).
        """
        for round_number in range(1, max_rounds + 1):
            if self.run_once():
                continue
            if self.messaging.flush_delayed():
                continue
            if any(mock.node.relay.retry_all_now() for mock in self.nodes):
                continue
            if self._wait_for_operations(operation_wait):
                continue
            deadlines = [d for m in self.nodes if (d := m.node.next_deadline()) is not None]
            if advance_clock and deadlines:
                self.clock.advance_to(min(deadlines))
                continue
            return round_number
        raise NetworkNotQuiescentError(
            f"the network was still busy after {max_rounds} rounds (a flow loop that never "
            "blocks, or messages bouncing forever?)"
        )

    def _wait_for_operations(self, timeout: float) -> bool:
        """Wait (real time) until an external operation of some node ends; True if one did."""
        running = [m.node.operations for m in self.nodes if m.node.operations.busy()]
        if not running or timeout <= 0:
            return False
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for operations in running:
                if operations.wait_for_end(min(left, 0.01)):
                    return True
        return False

    def stop_nodes(self) -> None:
        """Stop every node and, if the network made its directory, delete it."""
        for mock in self.nodes:
            mock.node.stop()
        for url, schema_name in self._schemas:
            drop_schema(url, schema_name)
        self._schemas = []
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> MockNetwork:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_nodes()
