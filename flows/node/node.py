"""A node: one identity, one database, one transport, the CorDapps, and the flows they run.

:class:`Node` holds the parts :func:`~flows.node.assembly.build_node` made for it (the state
machine manager, the store, the outbox relay, the inbound path, the greenlet fibers) and is
driven by calling :meth:`Node.run_once` (the test network does this step by step; a node
process does it in its loop). Its methods are what a node does for its users and operators:
start flows and tell their outcomes, pause, resume, retry and kill them, drain.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

from flows.config.node import NodeConfig
from flows.cordapps import Cordapps
from flows.decorators import flow_class_name_problem
from flows.errors import (
    FiberflowError,
    FlowDefinitionError,
    FlowStillRunningError,
    exception_from_error,
)
from flows.flow_logic import FlowLogic
from flows.network.identity import Counterparties, NodeIdentity, PeerKeys
from flows.node.busy import BusyMonitor
from flows.node.effects import FlowEffectRegistry
from flows.node.external_operations import ExternalOperations
from flows.node.flow_requests import FlowRequestIntake, encode_arguments
from flows.node.handles import FlowHandle, FlowHospitalizedError
from flows.node.operator_commands import OperatorCommands
from flows.node.schedules import FlowScheduler
from flows.party import Party
from foundation.serialization import Serializer, qualified_name
from messaging.authentication import MessageAuthenticator
from messaging.codec import SessionCodec
from messaging.inbound_path import InboundPath
from messaging.pair_keys import PairKeyCache
from messaging.relay import Relay
from messaging.service import MessagingService
from persistence.lease import NodeLease
from persistence.memory_store import InMemoryStore
from persistence.node_store import CheckpointSummary
from persistence.store import NodeDatabase
from persistence.worker_process import WorkerInfo
from statemachine.flow_end import FlowEnd, FlowToStart
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.manager import StateMachineManager
from statemachine.partitions import partition_of, sending_flow_of_message
from statemachine.ports import Clock, FailurePolicy, OutboxRow
from statemachine.state import FlowStatus

T = TypeVar("T")

log = logging.getLogger("fiberflow.node")


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


class Node:
    """A fiberflow node (see the module docstring): :func:`~flows.node.assembly.build_node`."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        identity: NodeIdentity,
        peers: PeerKeys,
        counterparties: Counterparties,
        pair_keys: PairKeyCache,
        authenticator: MessageAuthenticator,
        codec: SessionCodec,
        payloads: Serializer,
        clock: Clock,
        cordapps: Cordapps,
        worker: WorkerInfo,
        lease: NodeLease | None,
        database: NodeDatabase | InMemoryStore,
        messaging: MessagingService,
        inbound: InboundPath,
        relay: Relay,
        wakeup: threading.Event,
        busy: BusyMonitor,
        effects: FlowEffectRegistry,
        operations: ExternalOperations,
        manager: StateMachineManager,
        flow_requests: FlowRequestIntake,
        scheduler: FlowScheduler | None,
        hospital: FailurePolicy | None,
        after_round: Callable[[], None] | None,
    ) -> None:
        """The node of ``config`` over the parts :func:`~flows.node.assembly.build_node` made.

        ``lease`` is the process's (already acquired) lease, or None: :meth:`start` then
        takes a lease of its own and :meth:`stop` releases it. ``after_round`` is called after
        every round (the instruments' hook), if given.
        """
        self.config = config
        self.identity = identity
        self.peers = peers
        self.counterparties = counterparties
        """Which parties the node can reach (itself, and those on its network map)."""
        self.pair_keys = pair_keys
        """The node's keys with each peer (computed once per peer agreement key)."""
        self.authenticator = authenticator
        """Tags every message the node sends, for its target (the outbox relay holds it)."""
        self.codec = codec
        """Session messages to bytes and back, within the node's limits."""
        self.payloads = payloads
        """Flow payloads, arguments and results, within the node's limits."""
        self.party = Party(config.name)
        self.clock = clock
        self.cordapps = cordapps
        self.worker = worker
        """The process running the node (its id names its lease and its transport consumer)."""
        self._lease = lease
        self._owns_lease = lease is None
        self.database = database
        self.messaging = messaging
        self.inbound = inbound
        """Where the transport's messages pass on their way to the manager (tag check included)."""
        self.relay = relay
        self.relay.abandon = self.abandoned_reason
        self.wakeup = wakeup
        """Set whenever a message arrives (a node process's loop sleeps on it)."""
        self.busy = busy
        """Which flow's code runs now (the node process's watchdog reads it)."""
        self.effects = effects
        self.operations = operations
        """Runs flows' external operations off the scheduler (``FlowLogic.call_external``)."""
        self.manager = manager
        self.hospital = hospital
        self.flow_requests = flow_requests
        """Starts the flows clients asked for through the database."""
        self.scheduler = scheduler
        """Fires the due slots of the node's schedules (None on the non-durable store)."""
        self._after_round = after_round
        self.operator_commands = OperatorCommands(
            party=self.party,
            control=database.control,
            clock=clock,
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
        self.restored_flows = 0
        """How many checkpoints the node found at start (restored lazily)."""
        self.resent_messages = 0
        self._stopped = False
        self.partitions: frozenset[int] | None = None
        """The partitions of the node's flows this node runs: None for a node run as one
        process (all of them); for a worker of a node run by several workers, those its lease
        held when the node started (:mod:`persistence.lease`; a change rebuilds the node)."""

    def _check_running(self) -> None:
        if self._stopped:
            raise NodeStoppedError(f"node {self.party} was stopped")

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
            self.inbound.consume_partitions(self.partitions)
        self.restored_flows = self.manager.dormancy.restore(self.partitions)
        control = self.database.control
        for flow_id in control.paused_flows():
            if self.manager.holds(flow_id):
                self.manager.controls.pause_flow(flow_id)
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

    @property
    def incompatible_flows(self) -> dict[str, str]:
        """Restored flows the installed CorDapps cannot resume, with why (kept in the hospital).

        Flows are restored lazily (see :mod:`statemachine.manager`): a flow is checked when
        it is restored, not all at start.
        """
        return self.manager.dormancy.incompatible

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
        self.manager.controls.pause_flow(flow_id)
        self.database.control.set_paused(flow_id, True, self.clock.now())

    def resume_flow(self, flow_id: str) -> None:
        """Let a paused flow run again."""
        self._check_running()
        self.manager.controls.resume_flow(flow_id)
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
        # (its row shows the status it resumes with)
        self.manager.controls.retry_flow(stored.checkpoint)
        self.wakeup.set()

    def abandoned_reason(self, row: OutboxRow) -> str | None:
        """Why the relay should stop trying ``row``, whose target it cannot reach, or None.

        Only a row for a party off the network map is ever given up: if an operator dropped
        it (``fiberflow outbox drop``), or the flow that sent it has ended (killed, failed,
        or finished: no checkpoint left). A live flow's row is kept and tried again (the
        party may join again); ``fiberflow outbox list`` shows it.
        """
        if self.counterparties.knows(row.target):
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
        self.manager.controls.hospitalize(flow_id, error)  # its row says so too (logged there)

    def kill_flow(self, flow_id: str, reason: str = "killed by an operator") -> None:
        """End a flow wherever it is (running, suspended, in the hospital).

        Its counterparties get ``UnexpectedFlowEndException``; its checkpoint is removed and
        its handle raises ``FlowKilledException`` with ``reason``. The kill happens in the
        next round. Raises KeyError if the flow is not running on this node.
        """
        self._check_running()
        self.manager.controls.kill_flow(flow_id, reason)
        self.wakeup.set()

    def fail_flow(self, flow_id: str, error: FlowError) -> None:
        """End a flow with ``error`` (the flow hospital's ``flow_error`` rule).

        Like :meth:`kill_flow`, but the flow's handle raises the exception ``error``
        describes, and its counterparties see what an error in flow code would show them.
        """
        self._check_running()
        self.manager.controls.kill_flow(flow_id, error.message, error)
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
        if self._after_round is not None:
            self._after_round()
        return did_work

    def next_deadline(self) -> float | None:
        """The earliest timer a flow waits for, or None."""
        return self.manager.next_deadline()


def new_flow_ids(count: int) -> list[str]:
    """``count`` random (version 4) UUIDs in hex, from one read of the system's randomness."""
    random = os.urandom(16 * count)
    return [uuid.UUID(bytes=random[i : i + 16], version=4).hex for i in range(0, 16 * count, 16)]


__all__ = [
    "Node",
    "NodeDrainingError",
    "NodeStoppedError",
    "RetryFailedError",
    "UntrustedCheckpointError",
    "log_flow_failure",
    "new_flow_ids",
]
