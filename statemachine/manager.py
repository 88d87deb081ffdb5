"""The scheduler: feeds each flow its events, applies the transitions' results, drives fibers.

The manager is single-threaded and deterministic. :meth:`StateMachineManager.run_once` takes
whatever has arrived (inbound messages, due timers, due retries, fiber outcomes), feeds each
flow's events to :func:`statemachine.transition.transition`, performs all resulting actions
in one transaction (group commit), and only then applies the continuations (resuming
fibers). A transition with no actions resumes its fiber at once, so replay and non-blocking
requests cost no round trip through the database. Every change of a flow's status comes from
the transition table, also those operators ask for (kill, keep, retry: events like any other).

It applies decisions made elsewhere, each in a module of its own:

* where an inbound message goes: :mod:`statemachine.routing` (a pure decision);
* when deliveries are acknowledged: :mod:`statemachine.deliveries` (after the commit that
  took them in; dropped ones after a lease check);
* messages waiting for their session: :mod:`statemachine.parking`;
* running a fiber one step and naming its outcome: :mod:`statemachine.fiber_driver`;
* deadlines and retries: :mod:`statemachine.timers`;
* failures pinned on one flow or one message: :mod:`statemachine.isolation`, with a
  :class:`~statemachine.ports.FailurePolicy` (the node's flow hospital); without one, every
  error propagates (what a test wants to see);
* dormant flows, restored lazily and hibernated: :mod:`statemachine.dormancy` (with the
  policy of :mod:`statemachine.hibernation`);
* an operator's commands on flows: :mod:`statemachine.operator_controls`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence

import attrs

from statemachine.actions import Action
from statemachine.deliveries import Deliveries
from statemachine.dormancy import Compatibility, Dormancy
from statemachine.events import (
    DeliverSessionMessage,
    Event,
    Hospitalize,
    KillFlow,
    LoadFlow,
    OperationEnded,
    StartFlow,
    StartInitiatedFlow,
    WakeUp,
)
from statemachine.executor import ActionExecutor, BoundaryHook
from statemachine.fiber_driver import FiberDriver
from statemachine.flow_end import FlowEnd, FlowToStart
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.flow_table import FlowRuntime, FlowTable
from statemachine.hibernation import HibernationPolicy
from statemachine.intake import Intake
from statemachine.isolation import Batch, FailureIsolation
from statemachine.operator_controls import OperatorControls
from statemachine.ports import (
    CheckpointStore,
    Clock,
    FailureAction,
    FailurePolicy,
    FiberFactory,
    FlowEffects,
    InboundMessage,
    MessageCodec,
    OperationRunner,
    Outbound,
    ResponderRegistry,
)
from statemachine.result import Abort, Continuation, ProcessEvents, Resume, StartAgain, Throw
from statemachine.routing import (
    RoutingContext,
    Start,
)
from statemachine.session_ids import identity_tag
from statemachine.state import FlowState, FlowStatus, StartedLocally, StoredFlow
from statemachine.statistics import FlowCounts, ManagerStatistics
from statemachine.timers import WakeUps
from statemachine.transition import KEPT_IN_HOSPITAL, transition

log = logging.getLogger("fiberflow.statemachine")


class StateMachineManager:
    """Runs a node's flows. See the module docstring for the rules it follows."""

    def __init__(
        self,
        *,
        our_identity: str,
        store: CheckpointStore,
        codec: MessageCodec,
        outbound: Outbound,
        fibers: FiberFactory,
        responders: ResponderRegistry,
        acknowledge: Callable[[InboundMessage], None],
        clock: Clock,
        on_boundary: BoundaryHook | None = None,
        effects: FlowEffects | None = None,
        failures: FailurePolicy | None = None,
        operations: OperationRunner | None = None,
        hibernation: HibernationPolicy | None = None,
        compatibility: Compatibility | None = None,
    ) -> None:
        """Build a manager; the ports are described in :mod:`statemachine.ports`.

        ``hibernation`` says when waiting flows give up their memory (None: never);
        ``compatibility`` checks each restored flow against the installed flows (one it finds
        a problem with is kept in the hospital, and listed in :attr:`Dormancy.incompatible`).
        """
        self.our_identity = our_identity
        self._operations = operations
        self._session_tag = identity_tag(our_identity)
        self._store = store
        self._driver = FiberDriver(fibers, clock, on_boundary)
        self._acknowledge_one = acknowledge
        self._clock = clock
        self._flows = FlowTable()
        self._deliveries = Deliveries(acknowledge)
        self._wake_ups = WakeUps()
        self._end_listeners: list[Callable[[FlowEnd], None]] = []
        self.statistics = ManagerStatistics()
        self.executor = ActionExecutor(
            store,
            codec,
            outbound,
            self._settle,
            self._wake_ups.schedule,
            on_boundary,
            effects,
            operations,
        )
        self._isolation = (
            None
            if failures is None
            else FailureIsolation(
                failures, self._flows, self._deliveries, self._wake_ups, self.executor, clock.now
            )
        )
        self.dormancy = Dormancy(
            our_identity=our_identity,
            store=store,
            flows=self._flows,
            wake_ups=self._wake_ups,
            executor=self.executor,
            statistics=self.statistics,
            clock=clock,
            isolation=self._isolation,
            hibernation=hibernation,
            compatibility=compatibility,
            load=self._load,
            forget=lambda flow_id: self.forget_runtime(flow_id, ended=False),
            commit=self._commit,
            hospitalize=lambda flow_id, error: self.controls.hospitalize(flow_id, error),
        )
        """The dormant flows: restored lazily, hibernated (:mod:`statemachine.dormancy`)."""
        self._hibernates = self.dormancy.hibernates
        self._intake = Intake(
            context=RoutingContext(our_identity, responders),
            store=store,
            codec=codec,
            acknowledge=acknowledge,
            flows=self._flows,
            deliveries=self._deliveries,
            executor=self.executor,
            clock=clock,
            statistics=self.statistics,
            start_responder=self._start_responder,
            isolation=self._isolation,
            wake=self.dormancy.wake,
        )
        self.controls = OperatorControls(
            flows=self._flows,
            dormancy=self.dormancy,
            clock=clock,
            executor=self.executor,
            intake=self._intake,
            scheduling=self,
        )
        """An operator's commands on flows (:mod:`statemachine.operator_controls`)."""

    @property
    def draining(self) -> bool:
        """While True, initial messages from peers are rejected (no new responders)."""
        return self._intake.context.draining

    @draining.setter
    def draining(self, draining: bool) -> None:
        self._intake.context = attrs.evolve(self._intake.context, draining=draining)

    def add_end_listener(self, listener: Callable[[FlowEnd], None]) -> None:
        """Call ``listener`` whenever a flow completes or fails."""
        self._end_listeners.append(listener)

    # --- creating flows -----------------------------------------------------------------

    def _load(self, stored: StoredFlow) -> tuple[Action, ...]:
        """Make the flow the store found a runtime; returns the actions to commit for it."""
        result = transition(None, LoadFlow(stored, self._clock.now()))
        runtime = FlowRuntime(result.state)
        self.add_runtime(runtime)
        self.set_continuation(runtime, result.continuation)
        if result.state.status is FlowStatus.HOSPITALIZED and stored.checkpoint is None:
            reason = result.state.checkpoint.error.message if result.state.checkpoint.error else ""
            log.error("flow %s kept in the hospital: %s", stored.flow_id, reason)
        return result.actions

    def start_flow(self, flow_class: str, arguments: bytes, instance: object) -> str:
        """Create a flow and commit its Unstarted checkpoint now; it runs on the next round."""
        return self.start_flows([FlowToStart(uuid.uuid4().hex, flow_class, arguments, instance)])[0]

    def start_flows(self, flows: Sequence[FlowToStart], also: Sequence[Action] = ()) -> list[str]:
        """Create several flows, committing their Unstarted checkpoints in one transaction.

        ``also`` are actions committed in the same transaction (the node claims the client
        requests the flows answer, and records the requests it refused).
        """
        results = []
        for flow in flows:
            origin = StartedLocally(flow.flow_class, flow.arguments)
            event = StartFlow(flow.flow_id, origin, self._clock.now(), self._session_tag)
            results.append(transition(None, event))
        self.executor.execute([*(result.actions for result in results), tuple(also)])
        for flow, result in zip(flows, results, strict=True):
            runtime = FlowRuntime(result.state, instance=flow.instance)
            self.add_runtime(runtime)
            self.set_continuation(runtime, result.continuation)
            self.statistics.flows_started += 1
        return [flow.flow_id for flow in flows]

    def add_runtime(self, runtime: FlowRuntime) -> None:
        """Take a new flow runtime in (messages parked for its sessions are released)."""
        self._intake.release_parked(self._flows.add(runtime))

    def _index(self, runtime: FlowRuntime) -> None:
        self._intake.release_parked(self._flows.index(runtime))
        if self._hibernates:
            self.dormancy.note_status(runtime)

    def forget_runtime(self, flow_id: str, *, ended: bool) -> FlowRuntime | None:
        """Drop a flow's runtime (not its checkpoint); its fiber is aborted."""
        runtime = self._flows.remove(flow_id, forget_pause=ended)
        if runtime is not None and runtime.fiber is not None:
            runtime.fiber.abort()
            runtime.fiber = None
        self._wake_ups.forget(flow_id)
        self.dormancy.forget(flow_id)
        if self._operations is not None:
            self._operations.abandon(flow_id)
        return runtime

    # --- inbound ------------------------------------------------------------------------

    def deliver(self, message: InboundMessage) -> None:
        """Transport callback: queue an inbound message (processed by the next round).

        Safe to call from a transport's own thread (a deque append is atomic).
        """
        self._intake.deliver(message)

    def _start_responder(self, message: InboundMessage, start: Start) -> None:
        """Routing decided to start a responder for ``message`` (already taken in)."""
        event = StartInitiatedFlow(
            flow_id=start.flow_id,
            flow_class=start.responder.flow_class,
            message_id=message.message_id,
            sender=message.sender,
            initial=start.initial,
            flow_version=start.responder.flow_version,
            app_name=start.responder.app_name,
            at=self._clock.now(),
            session_tag=self._session_tag,
        )
        result = transition(None, event)
        runtime = FlowRuntime(result.state)
        self.add_runtime(runtime)
        self.set_continuation(runtime, result.continuation)
        self.statistics.flows_started += 1
        if self._isolation is not None:
            failed = self._isolation.fail_on_start.pop(start.flow_id, None)
            if failed is not None:  # its first step failed for good: it ends at once
                self.controls.kill_flow(start.flow_id, *failed)

    def _settle(self, message_ids: Sequence[str], fenced: bool) -> None:
        self._deliveries.settle(message_ids, fenced, self.executor.transactions)

    # --- timers and retries -----------------------------------------------------------------

    def _take_ended_operations(self) -> bool:
        """Queue each ended attempt of an external operation as its flow's event."""
        ended = [] if self._operations is None else self._operations.take_ended()
        now = self._clock.now()
        for attempt in ended:
            if attempt.flow_id not in self._flows:
                continue  # the flow ended, or was restored, meanwhile: nothing waits for it
            event = OperationEnded(
                attempt.ordinal, attempt.attempt, attempt.outcome, attempt.retryable, now
            )
            self._flows.queue_event(attempt.flow_id, event)
        return bool(ended)

    def _fire_due_timers(self) -> bool:
        now = self._clock.now()
        due = self._wake_ups.due(now, self._flows.holds)
        dormant = [flow_id for flow_id in due if self._flows.is_dormant(flow_id)]
        self.statistics.flows_woken += self.dormancy.restore_now(dormant)
        for flow_id in due:
            if flow_id in self._flows:
                self._flows.queue_event(flow_id, WakeUp(now))
        return bool(due)

    def _retry_due(self) -> bool:
        """Resume failed flows and route failed messages whose delay has passed."""
        if self._isolation is None:
            return False
        flows = self._isolation.flows_due()
        for flow_id in flows:
            self.resume_from_checkpoint(flow_id)
        messages = self._isolation.messages_due()
        self._intake.requeue(messages)
        return bool(flows or messages)

    def next_deadline(self) -> float | None:
        """The earliest pending wake-up, retry or expiry of parked messages, or None."""
        retry = None if self._isolation is None else self._isolation.next_due()
        deadlines = [self._wake_ups.next(self._flows.holds), retry]
        deadlines.append(self._intake.parking.next_expiry())
        found = [d for d in deadlines if d is not None]
        return min(found) if found else None

    def has_work(self) -> bool:
        """True if a round would do something now (not counting future timers)."""
        if self._intake.has_messages() or self._flows.has_ready() or self.dormancy.restoring():
            return True
        deadline = self.next_deadline()
        return deadline is not None and deadline <= self._clock.now()

    def pending_timers(self) -> int:
        """Timer entries held (live or stale, before compaction): for tests and reports."""
        return self._wake_ups.pending()

    # --- the round ----------------------------------------------------------------------

    def run_once(self) -> bool:
        """One round: route, transition, commit once, continue fibers. True if it did work."""
        did_work = self._fire_due_timers()
        did_work = self._take_ended_operations() or did_work
        did_work = self._retry_due() or did_work
        did_work = self._intake.expire_parked() or did_work
        did_work = self._intake.route_all() or did_work
        did_work = self.dormancy.restore_some() or did_work
        batch: Batch = []
        to_continue: list[FlowRuntime] = []
        awaiting: set[str] = set()  # flows with actions in the batch: their fibers wait
        while (flow_id := self._flows.pop_ready()) is not None:
            runtime = self._flows.get(flow_id)
            if runtime is None or (runtime.holding and not runtime.kill_queued()):
                continue
            did_work = True
            try:
                self._step_flow(runtime, batch, to_continue, awaiting)
            except Exception as error:
                if self._isolation is None:
                    raise
                self._flow_failed(runtime, error, _take_actions_of(flow_id, batch))
        if batch:
            self._commit(batch)
        for runtime in to_continue:
            if runtime.holding or self._flows.get(runtime.flow_id) is not runtime:
                continue  # it failed this round
            try:
                self._continue(runtime)
            except Exception as error:
                if self._isolation is None:
                    raise
                self._flow_failed(runtime, error, [])
        self._deliveries.settle_dropped(self.executor.transactions, self._store.check_lease)
        self.dormancy.hibernate_idle()
        return did_work

    def _commit(self, batch: Batch) -> None:
        if self._isolation is None:
            self.executor.execute([actions for _, actions in batch])
            return
        for flow_id, failure in self._isolation.commit(batch).items():
            runtime = self._flows.get(flow_id)
            assert runtime is not None
            self._flow_failed(runtime, failure, [a for f, a in batch if f == flow_id])
        self._isolation.forgive_committed(batch)

    def _step_flow(
        self,
        runtime: FlowRuntime,
        batch: Batch,
        to_continue: list[FlowRuntime],
        awaiting: set[str],
    ) -> None:
        """Feed the flow its queued events; run its fiber at once while nothing needs a commit.

        Once a transition of the flow has actions in the round's batch (``awaiting``), its
        fiber waits for the commit, also if the flow is stepped again in the same round.
        """
        flow_id = runtime.flow_id
        awaiting_commit = flow_id in awaiting
        while True:
            if runtime.continuation is not None and not awaiting_commit:
                if runtime.kill_queued():
                    # The flow is being killed: its fiber must not run another step (what it
                    # would do next is moot, and its outcome would arrive after the kill).
                    if not isinstance(runtime.continuation, Abort):
                        runtime.continuation = None
                else:
                    self._continue(runtime)
            if not runtime.events or self._flows.get(flow_id) is not runtime:
                break
            if isinstance(runtime.continuation, Abort):
                break  # the flow has ended: what is still queued is dropped by _abort
            previous = runtime.state
            result = transition(previous, runtime.events.popleft())
            runtime.state = result.state
            if isinstance(result.continuation, StartAgain):  # it continued as new
                sessions = previous.checkpoint.sessions
                self._flows.drop_sessions(runtime, (s.session_id for s in sessions))
            self._index(runtime)
            if not isinstance(result.continuation, ProcessEvents):
                runtime.continuation = result.continuation
            if result.actions:
                batch.append((flow_id, result.actions))
                awaiting_commit = True
                awaiting.add(flow_id)
        if runtime.continuation is not None:
            to_continue.append(runtime)

    def set_continuation(self, runtime: FlowRuntime, continuation: Continuation) -> None:
        """Make ``continuation`` the flow's next step (ready for the next round)."""
        if not isinstance(continuation, ProcessEvents):
            runtime.continuation = continuation
            self._flows.mark_ready(runtime.flow_id)

    def _continue(self, runtime: FlowRuntime) -> None:
        continuation, runtime.continuation = runtime.continuation, None
        flow_id = runtime.flow_id
        if continuation is None or self._flows.get(flow_id) is not runtime:
            return
        if isinstance(continuation, Abort):
            self._abort(runtime)
            return
        if isinstance(continuation, StartAgain):
            if runtime.fiber is not None:  # its last run ended in continue_as_new
                runtime.fiber.abort()
                runtime.fiber = None
            continuation = Resume(None)
        assert isinstance(continuation, Resume | Throw)
        self._flows.queue_event(flow_id, self._driver.step(runtime, continuation))

    def _abort(self, runtime: FlowRuntime) -> None:
        state = runtime.state
        if runtime.fiber is not None:
            runtime.fiber.abort()
            runtime.fiber = None
        if state.status is FlowStatus.HOSPITALIZED:
            self.statistics.flows_hospitalized += 1
            reason = state.checkpoint.error.message if state.checkpoint.error else ""
            log.error("flow %s kept in the hospital: %s", state.flow_id, reason)
            return
        self.forget_runtime(state.flow_id, ended=True)
        late = [e.message_id for e in runtime.events if isinstance(e, DeliverSessionMessage)]
        runtime.events.clear()
        self._deliveries.settle(late, False, self.executor.transactions)
        held = [*runtime.held.values(), *self._intake.parking.release_held(state.flow_id)]
        runtime.held = {}
        for message in held:  # held for it: its sessions are over now
            self.statistics.late_messages_dropped += 1
            self._deliveries.drop(message, self.executor.transactions)
        end = FlowEnd(
            state.flow_id,
            state.checkpoint.flow_class,
            state.status,
            result=runtime.result,
            error=state.checkpoint.error,
            traceback=runtime.traceback,
        )
        if state.status is FlowStatus.COMPLETED:
            self.statistics.flows_completed += 1
        else:
            self.statistics.flows_failed += 1
        for listener in self._end_listeners:
            listener(end)

    def apply_now(self, runtime: FlowRuntime, event: Event) -> None:
        """Apply an operator's or the node's event to a flow at once (committed now)."""
        result = transition(runtime.state, event)
        if result.actions:
            self.executor.execute([result.actions])
        runtime.state = result.state
        self._index(runtime)
        if isinstance(result.continuation, Abort):
            runtime.continuation = None
            self._flows.unready(runtime.flow_id)
            self._abort(runtime)
        else:
            self.set_continuation(runtime, result.continuation)

    # --- failures pinned on one flow or one message ----------------------------------------

    def _flow_failed(
        self, runtime: FlowRuntime, error: Exception, actions: Sequence[tuple[Action, ...]]
    ) -> None:
        assert self._isolation is not None
        treatment = self._isolation.flow_failed(runtime, error, actions)
        self.statistics.failures_pinned += 1
        flow_id = runtime.flow_id
        if treatment.action is FailureAction.KEEP:
            self.resume_from_checkpoint(flow_id, keep=treatment.reason)
        elif treatment.action is FailureAction.FAIL:
            assert treatment.error is not None
            self.resume_from_checkpoint(flow_id)
            if flow_id in self._flows:
                self.controls.kill_flow(flow_id, treatment.reason, treatment.error)
            else:  # a responder that never committed: it ends as soon as it is created again
                self._isolation.fail_on_start[flow_id] = (treatment.reason, treatment.error)

    def resume_from_checkpoint(self, flow_id: str, keep: str | None = None) -> None:
        """Drop a failed flow's memory and restore it from its stored checkpoint.

        With ``keep`` (the reason), the flow is then kept in the hospital (a
        :class:`~statemachine.events.Hospitalize` event): it does not run, and messages for
        it are taken in and buffered in its checkpoint, as for any kept flow. A flow that
        never committed (a responder whose first step failed) is forgotten and its held
        messages routed again: its initial message creates it again (with ``keep``, it then
        ends at once with the reason and its initiator is told).
        """
        runtime = self.forget_runtime(flow_id, ended=False)
        assert runtime is not None
        events = [e for e in runtime.events if isinstance(e, KillFlow)]
        self._intake.requeue(runtime.held.values())
        stored = self._store.load_checkpoint(flow_id)
        failure = None if keep is None else FlowError(ErrorKind.INTERNAL, KEPT_IN_HOSPITAL, keep)
        if stored is None:
            if keep is not None and failure is not None and self._isolation is not None:
                self._isolation.fail_on_start[flow_id] = (keep, failure)
            return
        self.executor.execute([self._load(stored)])
        fresh = self._flows.get(flow_id)
        assert fresh is not None
        fresh.events.extend(events)
        if events:
            self._flows.mark_ready(flow_id)
        if failure is not None:
            self.apply_now(fresh, Hospitalize(failure, self._clock.now()))

    # --- operators: each a flag, or an event of the transition table ------------------------

    # --- queries ------------------------------------------------------------------------

    def flow_state(self, flow_id: str) -> FlowState | None:
        """The in-memory state of a live (or hospitalized) flow."""
        runtime = self._flows.get(flow_id)
        return None if runtime is None else runtime.state

    def live_flows(self) -> list[FlowState]:
        """States of every flow in memory, in start order (dormant flows are not)."""
        return [runtime.state for runtime in self._flows]

    def holds(self, flow_id: str) -> bool:
        """True if the flow is live here: in memory or dormant."""
        return self._flows.holds(flow_id)

    def is_dormant(self, flow_id: str) -> bool:
        """True if the flow is dormant: hibernated, or not restored yet since the start."""
        return self._flows.is_dormant(flow_id)

    def flow_counts(self) -> FlowCounts:
        """How many flows are in memory (and waiting on what), dormant, being restored."""
        waiting: dict[str, int] = {}
        in_memory = 0
        for runtime in self._flows:
            in_memory += 1
            pending = runtime.state.checkpoint.pending
            if runtime.state.status is FlowStatus.SUSPENDED and pending is not None:
                kind = type(pending.request).__name__
                waiting[kind] = waiting.get(kind, 0) + 1
        return FlowCounts(
            in_memory=in_memory,
            dormant=self._flows.dormant_count(),
            restoring=self.dormancy.restoring(),
            waiting_in_memory=waiting,
        )

    def parked_message_count(self) -> int:
        """Messages waiting for a session that has not been opened yet."""
        return self._intake.parking.count()


def _take_actions_of(flow_id: str, batch: Batch) -> list[tuple[Action, ...]]:
    """Remove ``flow_id``'s actions from the round's batch; returns them."""
    mine = [actions for owner, actions in batch if owner == flow_id]
    batch[:] = [(owner, actions) for owner, actions in batch if owner != flow_id]
    return mine
