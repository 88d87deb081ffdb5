"""A node: one identity, one database, one transport, the CorDapps, and the flows they run.

:class:`Node` wires the parts together (the state machine manager, the SQLAlchemy store,
the outbox relay, the greenlet fibers) and is driven by calling :meth:`Node.run_once` (the
test network does this step by step; a node process does it in its loop).

Everything that depends on the node's configuration is made here, once, and handed to what
needs it: the session codec (its limits) to the manager, the payload serializer (the same
limits) and the payload limit to the fibers, the message authenticator to the outbox relay,
the verifier to the inbound path (both from the identity and the peers' keys, sharing the
node's per-peer keys). Nothing process-wide is configured, so nodes with different limits
can share a process.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import attrs

from flows.config.node import DEFAULT_RECEIVE_TIMEOUT, NodeConfig
from flows.decorators import flow_class_name_problem
from flows.errors import (
    FiberflowError,
    FlowDefinitionError,
    FlowStillRunningError,
    exception_from_error,
)
from flows.flow_logic import FlowLogic
from flows.network.identity import NodeIdentity, PeerKeys
from flows.node.busy import BusyMonitor
from flows.node.cordapps import Cordapps
from flows.node.effects import FlowEffectRegistry
from flows.node.external_operations import ExternalOperations
from flows.node.fiber import GreenletFiberFactory
from flows.node.flow_requests import FlowRequestIntake, encode_arguments
from flows.node.instruments import NodeInstruments
from flows.node.operator_commands import OperatorCommands
from flows.node.resident_memory import resident_bytes
from flows.node.schedules import FlowScheduler
from flows.party import Party
from foundation.engine import application_name
from foundation.serialization import (
    PAYLOADS,
    Serializer,
    qualified_name,
)
from messaging.authentication import MessageAuthenticator, MessageVerifier
from messaging.background_relay import BackgroundOutboxRelay
from messaging.codec import SessionCodec
from messaging.outbox_relay import OutboxRelay
from messaging.pair_keys import PairKeyCache
from messaging.relay import OutboxStore, Relay
from messaging.service import (
    SESSION_TOPIC,
    Message,
    MessagingService,
    PartitionedInbound,
    as_partitioned,
)
from persistence.lease import NodeLease, WorkerInfo
from persistence.memory_store import MEMORY_URL, InMemoryStore
from persistence.node_store import CheckpointSummary
from persistence.store import NodeDatabase
from statemachine.flow_end import FlowEnd, FlowToStart
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.hibernation import HibernationPolicy
from statemachine.manager import StateMachineManager
from statemachine.partitions import partition_of, partition_of_message, sending_flow_of_message
from statemachine.ports import (
    CheckpointStore,
    Clock,
    FailurePolicy,
    FiberFactory,
    InboundMessage,
    OutboxRow,
)
from statemachine.state import FlowStatus

T = TypeVar("T")

RelayFactory = Callable[[OutboxStore, MessageAuthenticator], Relay]
"""Builds a node's outbox relay from its outbox and its message authenticator."""

log = logging.getLogger("fiberflow.node")


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()


class FlowHospitalizedError(FlowStillRunningError):
    """The flow is kept in the hospital (for example, replay found it non-deterministic)."""


class FlowOutcomes(Protocol):
    """Where a handle asks about its flow (a node, or a mock node that survives restarts)."""

    def flow_status(self, flow_id: str) -> FlowStatus:
        """The flow's status."""

    def flow_result(self, flow_id: str) -> Any:
        """The flow's result (or its error raised)."""


class NodeDrainingError(FiberflowError):
    """The node is draining: it starts no new flows until told otherwise."""


class NodeStoppedError(FiberflowError):
    """The node was stopped; ask the node that replaced it."""


class UntrustedCheckpointError(FiberflowError):
    """A flow cannot be retried: its stored checkpoint still fails its integrity check."""


def log_flow_failure(end: FlowEnd) -> None:
    """Log a flow that failed because its code raised: one ERROR line, then the traceback."""
    if end.error is None or not end.traceback:
        return
    log.error(
        "flow %s (%s) failed: %s: %s\n%s",
        end.flow_id,
        end.flow_class,
        end.error.exception_class,
        end.error.message,
        end.traceback.rstrip(),
    )


class RetryFailedError(FiberflowError):
    """An operator's retry replayed the flow and it went straight back to the hospital."""


def _error_text(error: FlowError) -> str:
    """``Class: message`` of a stored flow error (its class's last name)."""
    name = error.exception_class.rpartition(".")[2] or error.kind.name
    return f"{name}: {error.message}" if error.message else name


class FlowHandle(Generic[T]):
    """A started flow: its id, and its result once it has finished."""

    def __init__(self, node: FlowOutcomes, flow_id: str) -> None:
        self._node = node
        self.flow_id = flow_id

    def done(self) -> bool:
        """True once the flow completed or failed."""
        return self._node.flow_status(self.flow_id) in (FlowStatus.COMPLETED, FlowStatus.FAILED)

    def result(self) -> T:
        """The flow's return value; raises its error if it failed, or if it has not finished."""
        return self._node.flow_result(self.flow_id)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"FlowHandle({self.flow_id})"


class Node:
    """A fiberflow node (see the module docstring)."""

    def __init__(
        self,
        config: NodeConfig,
        messaging: MessagingService,
        clock: Clock | None = None,
        on_boundary: Callable[[str], None] | None = None,
        *,
        identity: NodeIdentity,
        peers: PeerKeys,
        background_relay: bool = False,
        lease: NodeLease | None = None,
        hospital: FailurePolicy | None = None,
        busy: BusyMonitor | None = None,
        relay_factory: RelayFactory | None = None,
        instruments: NodeInstruments | None = None,
    ) -> None:
        """Wire a node; ``background_relay`` runs the outbox relay on its own thread.

        ``identity`` and ``peers`` (the peers' agreement keys) give the per-peer keys that
        tag every message the node sends and check every message it receives
        (:mod:`messaging.authentication`). The test network drives everything
        from one thread (``background_relay=False``); a node process sets it so the
        scheduler never waits for the transport.

        ``lease`` is the process's (already acquired) lease on the node database; without
        one, :meth:`start` acquires a lease of its own and :meth:`stop` releases it. Either
        way every write of the node's flows is fenced by it (:mod:`persistence.lease`).

        ``hospital`` decides about failures pinned on one flow or one message (a node process
        passes its :class:`~flows.node.hospital.Hospital`); without one, such errors propagate
        from :meth:`run_once` (what a test wants to see).

        ``relay_factory`` builds the outbox relay from the outbox and the authenticator instead (the
        peer-to-peer topology's bridges, :class:`~messaging.bridges.BridgeManager`).

        ``instruments`` observe the node (:mod:`flows.node.instruments`: the Prometheus metrics of
        :mod:`flows.metrics`); without them the node runs no hook at all.
        """
        self.hospital = hospital
        if identity.name != config.name:
            raise ValueError(f"node {config.name}: its identity is {identity.name!r}")
        if messaging.my_address != config.name:
            raise ValueError(
                f"node {config.name}: its transport address is {messaging.my_address!r}; "
                "they must be the same"
            )
        self.config = config
        self.identity = identity
        self.peers = peers
        self.pair_keys = PairKeyCache(identity, peers)
        """The node's keys with each peer (computed once per peer agreement key)."""
        self.authenticator = MessageAuthenticator(self.pair_keys)
        """Tags every message the node sends, for its target (the outbox relay holds it)."""
        self.verifier = MessageVerifier(self.pair_keys)
        """Checks every received message against the key shared with its claimed sender."""
        self.codec = SessionCodec(config.limits)
        """Session messages to bytes and back, within the node's limits."""
        self.payloads: Serializer = PAYLOADS.with_limits(config.limits)
        """Flow payloads, arguments and results, within the node's limits."""
        self.party = Party(config.name)
        self.clock: Clock = clock or SystemClock()
        self.cordapps = Cordapps(config.cordapps)
        self._lease = lease
        self._owns_lease = lease is None
        self.worker = lease.worker if lease is not None else WorkerInfo.of_this_process()
        """The process running the node (its id names its lease and its transport consumer)."""
        self.database: NodeDatabase | InMemoryStore = (
            InMemoryStore()
            if config.database_url == MEMORY_URL
            else NodeDatabase(
                config.database_url,
                synchronous=config.synchronous,
                schema_name=config.database_schema,
                mac_key=identity.mac_key(),
                application_name=application_name(self.worker.worker_id),
            )
        )
        self.messaging = messaging
        self.relay: Relay
        if relay_factory is not None:
            self.relay = relay_factory(self.database.outbox, self.authenticator)
        elif background_relay:
            self.relay = BackgroundOutboxRelay(
                messaging,
                self.database.outbox,
                authenticator=self.authenticator,
                deletes=self.database.outbox,  # the rows taken ride in the next transaction
            )
        else:
            self.relay = OutboxRelay(
                messaging, self.database.outbox, on_boundary, authenticator=self.authenticator
            )
        self.relay.abandon = self.abandoned_reason
        self.wakeup = threading.Event()
        """Set whenever a message arrives (a node process's loop sleeps on it)."""
        self.busy = busy or BusyMonitor()
        """Which flow's code runs now (the node process's watchdog reads it)."""
        self.effects = FlowEffectRegistry(self.busy)
        self.operations = ExternalOperations(
            self.payloads,
            threads=config.operation_threads,
            max_result_bytes=self.codec.max_payload_bytes,
            wake=self.wakeup.set,
        )
        """Runs flows' external operations off the scheduler (``FlowLogic.call_external``)."""
        fibers = GreenletFiberFactory(
            self.party,
            self.clock.now,
            self.cordapps.flow_class,
            self.effects,
            config.receive_timeout,
            self.busy,
            payloads=self.payloads,
            max_payload_bytes=self.codec.max_payload_bytes,
            operations=self.operations,
            unknown_party=self.unknown_party,
        )
        self._instruments = instruments
        store: CheckpointStore = self.database.checkpoints
        fiber_factory: FiberFactory = fibers
        if instruments is not None:
            store = instruments.checkpoint_store(store)
            fiber_factory = instruments.fibers(fibers)
        self.manager = StateMachineManager(
            our_identity=config.name,
            store=store,
            codec=self.codec,
            outbound=self.relay,
            fibers=fiber_factory,
            responders=self.cordapps,
            acknowledge=self._acknowledge,
            clock=self.clock,
            on_boundary=on_boundary,
            effects=self.effects,
            failures=hospital,
            operations=self.operations,
            hibernation=HibernationPolicy(
                idle_seconds=config.hibernate_after,
                memory_budget_bytes=(
                    None if config.memory_budget_mb is None else config.memory_budget_mb << 20
                ),
                resident_bytes=resident_bytes,
            ),
            compatibility=self.cordapps.compatibility_problem,
        )
        self.manager.add_end_listener(lambda end: self.effects.forget(end.flow_id))
        self.manager.add_end_listener(log_flow_failure)
        self.flow_requests = FlowRequestIntake(
            party=self.party,
            control=self.database.control,
            manager=self.manager,
            cordapps=self.cordapps,
            clock=self.clock,
            hospital=hospital,
        )
        """Starts the flows clients asked for through the database."""
        self.operator_commands = OperatorCommands(
            party=self.party,
            control=self.database.control,
            clock=self.clock,
            hospital=hospital,
            flow_commands={
                "kill": self.kill_flow,
                "pause": self.pause_flow,
                "resume": self.resume_flow,
                "retry": self.retry_and_observe,
            },
            set_draining=self.set_draining,
            refusals=(KeyError, UntrustedCheckpointError, RetryFailedError),
        )
        """Carries out the operator commands queued in the database."""
        schedules = self.database.schedules
        self.scheduler = None if schedules is None else FlowScheduler(schedules, self.clock.now)
        """Fires the due slots of the node's schedules (None on the non-durable store)."""
        messaging.add_handler(SESSION_TOPIC, self._on_message)
        self.restored_flows = 0
        """How many checkpoints the node found at start (restored lazily)."""
        self.resent_messages = 0
        self._stopped = False
        self.partitions: frozenset[int] | None = None
        """The partitions of the node's flows this node runs: None for a node run as one
        process (all of them); for a worker of a node run by several workers, those its lease
        held when the node started (:mod:`persistence.lease`; a change rebuilds the node)."""
        if instruments is not None:
            instruments.bind(self)

    def _check_running(self) -> None:
        if self._stopped:
            raise NodeStoppedError(f"node {self.party} was stopped")

    def _on_message(self, message: Message) -> None:
        partitions = self.partitions
        if (
            partitions is not None
            and partition_of_message(message.message_id, message.sender) not in partitions
        ):
            # Another worker's (the transport claimed it before a hand-over): give it back.
            self._partitioned_inbound().release(message)
            return
        problem = self.verifier.problem(message)
        self.manager.deliver(
            InboundMessage(message.message_id, message.sender, message.data, problem, message)
        )
        self.wakeup.set()

    def _acknowledge(self, inbound: InboundMessage) -> None:
        """Settle the transport delivery an inbound message came from."""
        if isinstance(inbound.delivery, Message):
            self.messaging.acknowledge(inbound.delivery)

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopped

    @property
    def lease(self) -> NodeLease | None:
        """The lease this node runs under (None on the non-durable store)."""
        return self._lease

    def start(self) -> None:
        """Take the lease, restore every checkpointed flow, re-send the outbox, receive.

        Raises :class:`~persistence.lease.LeaseHeldError` if another live process runs the
        node.
        """
        if self._lease is None:
            self._lease = self.database.new_lease(self.worker, self.config.lease_seconds)
            if self._lease is not None:  # (the non-durable store takes no lease)
                self._lease.acquire()
        self.database.lease = self._lease
        if self._lease is not None and self._lease.shared:
            self.partitions = frozenset(self._lease.epochs)
            self._partitioned_inbound().consume_partitions(self.partitions)
        self.restored_flows = self.manager.restore(self.partitions)
        control = self.database.control
        for flow_id in control.paused_flows():
            if self.manager.holds(flow_id):
                self.manager.pause_flow(flow_id)
        if control.setting("draining") is not None:
            self.manager.draining = True
            log.info("%s: draining (set before the restart): no new flows", self.party)
        self.relay.start()
        self.resent_messages = self.relay.resend_pending()
        if self._lease is not None and self._lease.taken_over_from:
            self.messaging.release_deliveries_of(
                [worker.worker_id for worker in self._lease.taken_over_from]
            )
        self.messaging.start()

    def _partitioned_inbound(self) -> PartitionedInbound:
        """The transport, as one that routes messages by partition (workers need one)."""
        return as_partitioned(self.messaging, f"node {self.party}")

    @property
    def incompatible_flows(self) -> dict[str, str]:
        """Restored flows the installed CorDapps cannot resume, with why (kept in the hospital).

        Flows are restored lazily (see :mod:`statemachine.manager`): a flow is checked when
        it is restored, not all at start.
        """
        return self.manager.incompatible

    def stop(self) -> None:
        """Stop receiving and relaying, release a lease of its own, close the database.

        Every unfinished flow stays checkpointed.
        """
        self._stopped = True
        self.operations.close()
        try:
            self.messaging.stop()
        finally:
            try:
                self.relay.stop()
            finally:
                try:
                    if self._owns_lease and self._lease is not None:
                        self._lease.release()
                finally:
                    self.database.close()

    def add_end_listener(self, listener: Callable[[FlowEnd], None]) -> None:
        """Call ``listener`` each time a flow on this node completes or fails."""
        self.manager.add_end_listener(listener)

    # --- flows --------------------------------------------------------------------------

    def start_flow(self, flow: FlowLogic[T]) -> FlowHandle[T]:
        """Checkpoint ``flow`` as Unstarted and schedule it; returns its handle at once."""
        return self.start_flows([flow])[0]

    def start_flows(self, flows: Sequence[FlowLogic[T]]) -> list[FlowHandle[T]]:
        """Checkpoint several flows as Unstarted in one transaction; their handles, in order.

        Every flow is checked before anything is written: one that cannot be started (not a
        flow, defined in a function, arguments that cannot be checkpointed) starts none.
        """
        self._check_running()
        if self.manager.draining:
            raise NodeDrainingError(f"node {self.party} is draining: it starts no new flows")
        to_start = []
        flow_ids = iter(self._new_flow_ids(len(flows)))
        for flow in flows:
            if not isinstance(flow, FlowLogic):
                raise TypeError(f"start_flow needs a FlowLogic instance, not {type(flow).__name__}")
            cls = type(flow)
            if "<locals>" in cls.__qualname__:
                raise FlowDefinitionError(
                    f"{cls.__qualname__} is defined inside a function, so a restarted node "
                    "could not find it by name; move it to module level"
                )
            problem = flow_class_name_problem(cls)
            if problem is not None:
                raise FlowDefinitionError(f"{cls.__qualname__} cannot be started: {problem}")
            arguments = encode_arguments(flow, self.payloads)
            to_start.append(FlowToStart(next(flow_ids), qualified_name(cls), arguments, flow))
        return [FlowHandle(self, flow_id) for flow_id in self.manager.start_flows(to_start)]

    def _new_flow_ids(self, count: int) -> list[str]:
        """Ids for new flows, in this node's partitions (a worker runs only its own)."""
        partitions = self.partitions
        if partitions is None:
            return new_flow_ids(count)
        if not partitions:
            raise NodeStoppedError(
                f"worker {self.worker.name!r} of node {self.party} holds no partition of the "
                "node's flows yet: it starts no flow (start it through another worker, or "
                "queue a flow request, which the worker holding its partition starts)"
            )
        found: list[str] = []
        while len(found) < count:
            found.extend(i for i in new_flow_ids(count) if partition_of(i) in partitions)
        return found[:count]

    def fire_schedules(self) -> int:
        """Turn the due slots of the node's schedules into flow requests; returns how many.

        :meth:`start_requested_flows` then starts them, each exactly once
        (:mod:`flows.node.schedules`).
        """
        self._check_running()
        return 0 if self.scheduler is None else self.scheduler.fire_due(self.partitions)

    def start_requested_flows(self, limit: int = 500) -> int:
        """Start flows clients asked for in ``node_flow_requests``; returns how many.

        Each request is started exactly once (:mod:`flows.node.flow_requests`).
        """
        self._check_running()
        return self.flow_requests.start_pending(limit, self.partitions)

    # --- operators ------------------------------------------------------------------------

    def pause_flow(self, flow_id: str) -> None:
        """Stop running ``flow_id`` (it keeps its place and messages) until resumed."""
        self._check_running()
        self.manager.pause_flow(flow_id)
        self.database.control.set_paused(flow_id, True, self.clock.now())

    def resume_flow(self, flow_id: str) -> None:
        """Let a paused flow run again."""
        self._check_running()
        self.manager.resume_flow(flow_id)
        self.database.control.set_paused(flow_id, False, self.clock.now())
        self.wakeup.set()

    def retry_flow(self, flow_id: str) -> None:
        """Replay a hospitalized flow from its stored checkpoint (after a fix)."""
        self._check_running()
        if not self.database.durable:
            raise KeyError("retry needs a database (checkpoints are off)")
        stored = self.database.checkpoints.load_checkpoint(flow_id)
        if stored is None:
            raise KeyError(f"flow {flow_id} has no checkpoint on {self.party}")
        if stored.checkpoint is None:
            # What the store holds is not the flow: running a placeholder would lose it.
            raise UntrustedCheckpointError(
                f"flow {flow_id} cannot be retried: {stored.problem}; restore its checkpoint "
                "(blob and MAC) from a backup first, or kill it"
            )
        self.manager.retry_flow(stored.checkpoint)  # its row shows the status it resumes with
        self.wakeup.set()

    def abandoned_reason(self, row: OutboxRow) -> str | None:
        """Why the relay should stop trying ``row``, whose target it cannot reach, or None.

        Only a row for a party off the network map is ever given up: if an operator dropped
        it (``fiberflow outbox drop``), or the flow that sent it has ended (killed, failed,
        or finished: no checkpoint left). A live flow's row is kept and tried again (the
        party may join again); ``fiberflow outbox list`` shows it.
        """
        if self.knows_party(row.target):
            return None
        if not self.database.outbox.contains(row.message_id):
            return "dropped by an operator"
        flow_id = sending_flow_of_message(row.message_id, row.target)
        if flow_id is None:
            return None
        if self.manager.flow_state(flow_id) is not None or self.manager.is_dormant(flow_id):
            return None
        if self.database.checkpoints.has_checkpoint(flow_id):
            return None
        return f"{row.target} is not on the network map and flow {flow_id} has ended"

    def knows_party(self, name: str) -> bool:
        """True if the network map has an entry for party ``name`` that verified (or it is us)."""
        return name == self.config.name or self.peers.agreement_key(name) is not None

    def unknown_party(self, name: str) -> str | None:
        """Why party ``name`` cannot be reached (not on the network map, its entry refused)."""
        if self.knows_party(name):
            return None
        refusal = self.peers.refusal(name)
        if refusal is not None:
            return f"its node-info on the network map is refused ({refusal})"
        return "it is not on this node's network map (check the name)"

    def retry_and_observe(self, flow_id: str) -> None:
        """Retry a hospitalized flow and replay it at once (the operator's ``flow retry``).

        Raises :class:`RetryFailedError` with the reason when the replay sends the flow
        straight back to the hospital (the fix is not there yet), so the command answers
        with that rather than ``ok``.
        """
        self.retry_flow(flow_id)
        self.run_once()  # the replay, now: the answer says what became of the flow
        state = self.manager.flow_state(flow_id)
        if state is not None and state.status is FlowStatus.HOSPITALIZED:
            error = state.checkpoint.error
            reason = "no reason recorded" if error is None else _error_text(error)
            raise RetryFailedError(f"flow {flow_id} went straight back to the hospital: {reason}")

    @property
    def draining(self) -> bool:
        """True while the node refuses new flows (local or from peers)."""
        return self.manager.draining

    def set_draining(self, draining: bool) -> int:
        """Refuse (or accept again) new flows; returns how many flows are still live.

        The setting outlives restarts: a draining node stays draining until undrained.
        """
        self.database.control.set_setting(
            "draining", "true" if draining else None, self.clock.now()
        )
        self.manager.draining = draining
        left = self.manager.flow_counts().live
        log.info(
            "%s: %s; %d flow(s) left",
            self.party,
            "draining: no new flows" if draining else "accepting new flows",
            left,
        )
        return left

    def publish_flow_counts(self) -> None:
        """Say how many flows are in memory, hibernated and restoring, for ``flow list``.

        A JSON document (with when it was taken and the partitions run) that rides on the
        lease's next renewal, on this process's row of ``node_workers``: no write of its own.
        """
        if self._lease is None:
            return
        counts = self.manager.flow_counts()
        document = {**attrs.asdict(counts), "at": self.clock.now()}
        if self.partitions is not None:
            document["partitions"] = sorted(self.partitions)
        self._lease.flow_counts = json.dumps(document)

    def process_operator_requests(self) -> int:
        """Carry out the operator commands queued in the database; returns how many."""
        return self.operator_commands.process(self.partitions)

    def keep_in_hospital(self, flow_id: str, reason: str) -> None:
        """Keep a live flow for observation (it does not run until retried or killed)."""
        if not self.manager.holds(flow_id):
            return
        error = FlowError(ErrorKind.INTERNAL, "flows.errors.FlowFailedError", reason)
        self.manager.hospitalize(flow_id, error)  # its row says so too (logged there)

    def kill_flow(self, flow_id: str, reason: str = "killed by an operator") -> None:
        """End a flow wherever it is (running, suspended, in the hospital).

        Its counterparties get ``UnexpectedFlowEndException``; its checkpoint is removed and
        its handle raises ``FlowKilledException`` with ``reason``. The kill happens in the
        next round. Raises KeyError if the flow is not running on this node.
        """
        self._check_running()
        self.manager.kill_flow(flow_id, reason)
        self.wakeup.set()

    def fail_flow(self, flow_id: str, error: FlowError) -> None:
        """End a flow with ``error`` (the flow hospital's ``flow_error`` rule).

        Like :meth:`kill_flow`, but the flow's handle raises the exception ``error``
        describes, and its counterparties see what an error in flow code would show them.
        """
        self._check_running()
        self.manager.kill_flow(flow_id, error.message, error)
        self.wakeup.set()

    def flow_handle(self, flow_id: str) -> FlowHandle[Any]:
        """The handle of a flow started earlier (also after a restart)."""
        self.flow_status(flow_id)  # raises KeyError for an unknown id
        return FlowHandle(self, flow_id)

    def flow_status(self, flow_id: str) -> FlowStatus:
        """The flow's status; raises KeyError if this node never had it."""
        self._check_running()
        state = self.manager.flow_state(flow_id)
        if state is not None:
            return state.status
        if self.manager.is_dormant(flow_id):
            return self._dormant_status(flow_id)
        stored = self.database.checkpoints.stored_outcome(flow_id)
        if stored is not None:
            return FlowStatus.COMPLETED if stored.error is None else FlowStatus.FAILED
        raise KeyError(f"no flow {flow_id} on {self.party}")

    def flow_result(self, flow_id: str) -> Any:
        """The result of a finished flow (raises its error, or FlowStillRunningError)."""
        self._check_running()
        state = self.manager.flow_state(flow_id)
        if state is None and self.manager.is_dormant(flow_id):
            raise FlowStillRunningError(
                f"flow {flow_id} has not finished (status "
                f"{self._dormant_status(flow_id).value}, hibernated); run the network until it does"
            )
        if state is not None:
            if state.status is FlowStatus.HOSPITALIZED:
                reason = state.checkpoint.error.message if state.checkpoint.error else "unknown"
                raise FlowHospitalizedError(f"flow {flow_id} is in the hospital: {reason}")
            raise FlowStillRunningError(
                f"flow {flow_id} has not finished (status {state.status.value}); "
                "run the network until it does"
            )
        stored = self.database.checkpoints.stored_outcome(flow_id)
        if stored is None:
            raise KeyError(f"no flow {flow_id} on {self.party}")
        if stored.error is not None:
            raise exception_from_error(stored.error, stored.traceback)
        assert stored.result is not None
        return self.payloads.decode(stored.result)

    def _dormant_status(self, flow_id: str) -> FlowStatus:
        """A dormant flow's status, as its row shows it (it is not in memory)."""
        for summary in self.database.checkpoints.checkpoint_summaries([flow_id]):
            return FlowStatus(summary.status)
        return FlowStatus.SUSPENDED

    def checkpoints(self) -> list[tuple[str, str, str]]:
        """(flow id, flow class, status) of every flow with a stored checkpoint."""
        return [(c.flow_id, c.flow_class, c.status) for c in self.checkpoint_summaries()]

    def checkpoint_summaries(self) -> list[CheckpointSummary]:
        """The stored checkpoints' summary rows."""
        return self.database.checkpoints.checkpoint_summaries()

    # --- driving ------------------------------------------------------------------------

    def run_once(self) -> bool:
        """One scheduling round (retries, messages, timers, flows); True if it did work."""
        self._check_running()
        if self._owns_lease and self._lease is not None:
            self._lease.renew_if_due()
        did_work = self.relay.retry_due()
        did_work = self.manager.run_once() or did_work
        self.relay.flush()
        if self._instruments is not None:
            self._instruments.after_round()
        return did_work

    def next_deadline(self) -> float | None:
        """The earliest timer a flow waits for, or None."""
        return self.manager.next_deadline()


def new_flow_ids(count: int) -> list[str]:
    """``count`` random (version 4) UUIDs in hex, from one read of the system's randomness."""
    random = os.urandom(16 * count)
    return [uuid.UUID(bytes=random[i : i + 16], version=4).hex for i in range(0, 16 * count, 16)]


__all__ = [
    "DEFAULT_RECEIVE_TIMEOUT",
    "FiberflowError",
    "FlowHandle",
    "FlowHospitalizedError",
    "FlowOutcomes",
    "Node",
    "encode_arguments",
    "NodeDrainingError",
    "NodeStoppedError",
    "RetryFailedError",
    "UntrustedCheckpointError",
    "NodeConfig",
    "SystemClock",
]
