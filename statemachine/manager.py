"""The state machine manager: routes messages and timers to flows and drives their fibers.

The manager is single-threaded and deterministic: :meth:`StateMachineManager.run_once` takes
whatever has arrived (inbound messages, due timers, fiber outcomes), feeds each flow's events
to :func:`statemachine.transition.transition`, performs all resulting actions in one
transaction (group commit), and only then applies the continuations (resuming fibers).
A transition with no actions resumes its fiber at once, so replay and non-blocking requests
cost no round trip through the database.

With a :class:`~statemachine.ports.FailurePolicy` (the node's flow hospital), a failure is
pinned on what caused it whenever possible, and the node goes on serving everything else:

* an error while taking in one inbound message is that message's: it is routed again after
  a delay, and quarantined (dead-lettered with the reason) when it keeps failing;
* an error in one flow's step (its transition, its fiber, or its transaction: a failed group
  commit is retried one flow per transaction to find which flows are at fault, and the
  others commit) is that flow's: it is resumed from its last checkpoint after a delay (the
  messages it had taken in are held for it meanwhile), kept in the hospital when it keeps
  failing, or failed, as the policy says;
* a checkpoint that cannot even be restored keeps its flow in the hospital at start.

Errors the policy calls node-wide (the database is down, the lease is lost) propagate.

Inbound messages are dedup-checked twice: against the ids the store has recorded, and
against an in-memory set of ids taken in but not yet committed ("being processed"). They are
acknowledged only after the transition that took them in has committed.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import uuid
from collections import deque
from collections.abc import Callable, Sequence

import attrs

from statemachine.actions import AcknowledgeMessages, Action, RecordInboundMessages
from statemachine.errors import AfterCommitError
from statemachine.events import (
    DeliverSessionMessage,
    Event,
    FlowFailed,
    FlowFinished,
    KillFlow,
    RestoreFlow,
    StartFlow,
    StartInitiatedFlow,
    Suspend,
    WakeUp,
)
from statemachine.executor import ActionExecutor, BoundaryHook
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.ports import (
    CheckpointStore,
    Clock,
    Failed,
    FailureAction,
    FailurePolicy,
    Fiber,
    FiberFactory,
    FiberOutcome,
    FlowEffects,
    InboundMessage,
    MessageCodec,
    Outbound,
    ResponderRegistry,
    Returned,
    Suspended,
)
from statemachine.result import Abort, Continuation, ProcessEvents, Resume, Throw
from statemachine.session_ids import (
    flow_id_of_session,
    identity_tag,
    is_bound_to,
    is_responder_session_id,
    message_id,
    peer_session_id,
    responder_flow_id,
)
from statemachine.session_messages import (
    ExistingSessionMessage,
    InitialSessionMessage,
)
from statemachine.state import Checkpoint, FlowState, FlowStatus, StartedLocally
from statemachine.transition import reject_initial_session, transition

log = logging.getLogger("fiberflow.statemachine")


MAX_REORDER_WINDOW = 1024
"""A message further ahead of its session's next expected sequence number is refused."""
MAX_PARKED_PER_SESSION = 64
"""Messages held for one session that has not opened yet."""
MAX_PARKED = 1_000
"""Messages held in all for sessions not open yet. Held messages are unacknowledged: on AMQP
each takes a slot of the consumer's prefetch window (``messaging.amqp.DEFAULT_PREFETCH``,
2,000), so this stays well below it and parked messages can never starve the node."""
PARKED_TIMEOUT_SECONDS = 600.0
"""Messages for a session that has not opened after this long are dead-lettered."""
"""Bounds on messages held while waiting for their session's initial message."""


@attrs.frozen
class FlowEnd:
    """How a flow ended: a serialized result, or an error."""

    flow_id: str
    flow_class: str
    status: FlowStatus
    result: bytes | None = None
    error: FlowError | None = None


@attrs.frozen
class FlowToStart:
    """A flow to start: its id, class name, encoded arguments, and instance (or None)."""

    flow_id: str
    flow_class: str
    arguments: bytes
    instance: object = None


@attrs.define
class _FlowRuntime:
    state: FlowState
    instance: object | None = None
    fiber: Fiber | None = None
    events: deque[Event] = attrs.field(factory=deque)
    continuation: Continuation | None = None
    result: bytes | None = None
    holding: bool = False
    """The flow does not run: it waits for a retry after a failure. Messages for it are
    held raw in ``held`` (unacknowledged)."""
    held: dict[tuple[str, str], InboundMessage] = attrs.field(factory=dict)
    """By (message id, sender): a redelivery replaces the copy held before."""
    retry_at: float | None = None
    """When a flow that failed is resumed from its last checkpoint (None: not waiting)."""
    indexed_sessions: int = 0
    """How many of the flow's sessions (which only ever grow, in order) are indexed."""


@attrs.define
class ManagerStatistics:
    """Counters a node reports (and tests and benchmarks read)."""

    messages_received: int = 0
    duplicates_dropped: int = 0
    late_messages_dropped: int = 0
    dead_lettered: int = 0
    sessions_rejected: int = 0
    flows_started: int = 0
    flows_completed: int = 0
    flows_failed: int = 0
    flows_hospitalized: int = 0
    failures_pinned: int = 0
    """Failures pinned on one flow or one message (each resumed, kept, failed or quarantined)."""
    messages_quarantined: int = 0


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
    ) -> None:
        self.our_identity = our_identity
        self._failures = failures
        self._session_tag = identity_tag(our_identity)
        self._store = store
        self._fibers = fibers
        self._responders = responders
        self._codec = codec
        self._acknowledge_one = acknowledge
        self._clock = clock
        self._on_boundary = on_boundary
        self.executor = ActionExecutor(
            store,
            codec,
            outbound,
            self._acknowledge,
            self._schedule_wake_up,
            on_boundary,
            effects,
        )
        self._flows: dict[str, _FlowRuntime] = {}
        self._ready: deque[str] = deque()
        self._ready_set: set[str] = set()
        self._session_owner: dict[str, str] = {}
        # Message id -> every delivery of it held until the transition that takes it in
        # commits (the first copy, and redelivered copies that arrived meanwhile).
        self._in_process: dict[str, list[InboundMessage]] = {}
        self._parked: dict[str, list[InboundMessage]] = {}
        self._inbox: deque[InboundMessage] = deque()
        self._parked_total = 0
        self._held_for: dict[str, set[str]] = {}  # kept flow id -> session ids held for it
        self._paused: set[str] = set()
        self._paused_ready: set[str] = set()
        self.draining = False
        """While True, initial messages from peers are rejected (no new responders)."""
        self._parked_since: dict[str, float] = {}
        self._timers: list[tuple[float, int, str]] = []
        self._deadline_of: dict[str, float] = {}  # flow id -> its one live deadline
        self._timer_sequence = 0
        self._end_listeners: list[Callable[[FlowEnd], None]] = []
        self.statistics = ManagerStatistics()
        # Failures pinned on flows and messages (see the module docstring).
        self._flow_retries: list[tuple[float, int, str]] = []
        self._message_retries: list[tuple[float, int, InboundMessage]] = []
        self._retry_sequence = 0
        self._failed_flows: set[str] = set()  # flows with failures counted against them
        self._fail_on_start: dict[str, tuple[str, FlowError]] = {}
        if failures is not None:  # counts that outlived an earlier manager of the node
            self._failed_flows.update(failures.counted())
        self._unsettled: list[InboundMessage] = []  # dropped, settled after a lease check
        self._unsettled_mark = 0
        self._failed_messages: set[str] = set()

    # --- lifecycle ----------------------------------------------------------------------

    def restore(self) -> int:
        """Load every stored checkpoint and schedule its replay; returns how many were loaded."""
        checkpoints = self._store.load_checkpoints()
        for checkpoint in checkpoints:
            try:
                self._restore_one(checkpoint)
            except Exception as error:
                if self._failures is None or self._failures.is_node_wide(error):
                    raise
                self._keep_unrestorable(checkpoint, error)
        return len(checkpoints)

    def _restore_one(self, checkpoint: Checkpoint) -> _FlowRuntime:
        result = transition(None, RestoreFlow(checkpoint, self._clock.now()))
        runtime = _FlowRuntime(result.state)
        self._flows[checkpoint.flow_id] = runtime
        self._index_sessions(runtime)
        self._set_continuation(runtime, result.continuation)
        return runtime

    def _keep_unrestorable(self, checkpoint: Checkpoint, error: Exception) -> None:
        """Keep a flow whose checkpoint cannot be restored (its row says why)."""
        reason = f"its checkpoint cannot be restored: {type(error).__name__}: {error}"
        self._forget_runtime(checkpoint.flow_id)
        kept = attrs.evolve(
            checkpoint,
            status=FlowStatus.HOSPITALIZED,
            error=FlowError(ErrorKind.INTERNAL, KEPT_AFTER_FAILURES, reason),
        )
        self._restore_one(kept)
        self._store.mark_hospitalized(checkpoint.flow_id, reason)
        self.statistics.flows_hospitalized += 1
        log.error("flow %s kept in the hospital: %s", checkpoint.flow_id, reason)

    def add_end_listener(self, listener: Callable[[FlowEnd], None]) -> None:
        """Call ``listener`` whenever a flow completes or fails."""
        self._end_listeners.append(listener)

    # --- starting flows -----------------------------------------------------------------

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
            runtime = _FlowRuntime(result.state, instance=flow.instance)
            self._flows[flow.flow_id] = runtime
            self._set_continuation(runtime, result.continuation)
            self.statistics.flows_started += 1
        return [flow.flow_id for flow in flows]

    # --- inbound ------------------------------------------------------------------------

    def deliver(self, message: InboundMessage) -> None:
        """Transport callback: queue an inbound message (processed by the next round).

        Safe to call from a transport's own thread (a deque append is atomic).
        """
        self._inbox.append(message)

    def _route_all(self) -> None:
        """Route every queued inbound message, checking their ids in one query."""
        # popleft, not clear(): a transport thread may append while we drain.
        messages = [self._inbox.popleft() for _ in range(len(self._inbox))]
        consumed = self._store.consumed_among([m.message_id for m in messages])
        for message in messages:
            if self._failures is None:
                self._route(message, message.message_id in consumed)
                continue
            try:
                self._route(message, message.message_id in consumed)
            except Exception as error:
                self._message_failed(message, error)
            else:
                key = _message_key(message)
                if key in self._failed_messages:
                    self._failed_messages.discard(key)
                    self._failures.message_recovered(key)

    def _route(self, message: InboundMessage, consumed: bool) -> None:
        self.statistics.messages_received += 1
        if message.rejection is not None:  # refused even if its id was seen: it is forged
            self._dead_letter(message, message.rejection)
            return
        if consumed:
            self.statistics.duplicates_dropped += 1
            self._settle_after_fence(message)
            return
        held = self._in_process.get(message.message_id)
        if held is not None and held[0].sender == message.sender:
            # Another copy (a redelivery: an expired lease, a reconnect) is being taken in.
            # Settling this one now could leave no durable copy if the first one's
            # transaction then fails: it is settled with the first, after the commit.
            self.statistics.duplicates_dropped += 1
            held.append(message)
            return
        try:
            decoded = self._codec.decode(message.data)
        except Exception as error:  # any decoding failure: keep the message, tell why
            self._dead_letter(message, f"undecodable session message: {error}")
            return
        if isinstance(decoded, InitialSessionMessage):
            self._route_initial(message, decoded)
        else:
            self._route_existing(message, decoded)

    def _dead_letter(self, message: InboundMessage, reason: str) -> None:
        log.warning(
            "dead-lettering message %s from %s: %s", message.message_id, message.sender, reason
        )
        self._store.dead_letter(message, reason, self._clock.now())
        self.statistics.dead_lettered += 1
        self._acknowledge_one(message)  # this delivery only: a genuine copy is not touched

    def _route_initial(self, message: InboundMessage, initial: InitialSessionMessage) -> None:
        expected_id = message_id(initial.initiator_session_id, 0)
        if message.message_id != expected_id:
            self._dead_letter(message, f"initial session message must have id {expected_id}")
            return
        if not is_bound_to(initial.initiator_session_id, message.sender):
            self._dead_letter(
                message,
                f"session id {initial.initiator_session_id!r} is not {message.sender}'s: a "
                f"session opened by it starts with its tag {identity_tag(message.sender)}-",
            )
            return
        at = self._clock.now()
        responder = self._responders.responder_for(initial.initiator_flow_class)
        if responder is None or self.draining:
            reason = (
                f"{self.our_identity} is draining: it starts no new flows"
                if self.draining
                else f"{self.our_identity} has no flow registered to respond to "
                f"{initial.initiator_flow_class} (install the CorDapp whose flow is annotated "
                f"@initiated_by({initial.initiator_flow_class.rsplit('.', 1)[-1]}))"
            )
            log.warning("rejecting session from %s: %s", message.sender, reason)
            self._take_in(message)
            self.statistics.sessions_rejected += 1
            self.executor.execute(
                [reject_initial_session(message.message_id, message.sender, initial, reason, at)]
            )
            return
        flow_id = responder_flow_id(message.sender, initial.initiator_session_id)
        existing = self._flows.get(flow_id)
        if existing is not None and existing.holding:
            _hold_message(existing, message)  # its first step failed: retried with this
            return
        if existing is not None:
            self._dead_letter(message, f"session {initial.initiator_session_id} already open")
            return
        self._take_in(message)
        event = StartInitiatedFlow(
            flow_id=flow_id,
            flow_class=responder.flow_class,
            message_id=message.message_id,
            sender=message.sender,
            initial=initial,
            flow_version=responder.flow_version,
            app_name=responder.app_name,
            at=at,
            session_tag=self._session_tag,
        )
        result = transition(None, event)
        runtime = _FlowRuntime(result.state)
        self._flows[flow_id] = runtime
        self._index_sessions(runtime)
        self._set_continuation(runtime, result.continuation)
        self.statistics.flows_started += 1
        failed = self._fail_on_start.pop(flow_id, None)
        if failed is not None:  # its first step failed for good: it ends at once
            self.kill_flow(flow_id, *failed)

    def _route_existing(self, message: InboundMessage, decoded: ExistingSessionMessage) -> None:
        session_id = decoded.recipient_session_id
        expected_id = message_id(peer_session_id(session_id), decoded.sequence)
        if message.message_id != expected_id:
            self._dead_letter(
                message,
                f"message id {message.message_id} does not match its session and sequence "
                f"(expected {expected_id})",
            )
            return
        owner = self._session_owner.get(session_id)
        if owner is None:
            self._route_unknown_session(message, session_id)
            return
        runtime = self._flows[owner]
        session = runtime.state.checkpoint.session(session_id)
        if session is None or session.counterparty != message.sender:
            self._dead_letter(
                message, f"session {session_id} does not belong to sender {message.sender}"
            )
            return
        if decoded.sequence >= session.next_receive_sequence + MAX_REORDER_WINDOW:
            self._dead_letter(
                message,
                f"sequence number {decoded.sequence} is too far ahead of session {session_id} "
                f"(expecting {session.next_receive_sequence}, window {MAX_REORDER_WINDOW})",
            )
            return
        if runtime.holding:
            _hold_message(runtime, message)
            return
        self._take_in(message)
        self._queue_event(
            owner,
            DeliverSessionMessage(
                session_id,
                message.message_id,
                message.sender,
                decoded.sequence,
                decoded.body,
                self._clock.now(),
            ),
        )

    def _route_unknown_session(self, message: InboundMessage, session_id: str) -> None:
        """A message for a session no live flow owns: not opened yet, or already over."""
        kept = self._kept_flow_for(session_id, message.sender)
        if kept is not None:
            # Its flow is in the hospital with a checkpoint that could not be read (so its
            # sessions are unknown): hold the message, unacknowledged and without a time
            # limit, until an operator retries the flow (then it is taken in) or kills it.
            if self._park(message, session_id, expires=False):
                self._held_for.setdefault(kept, set()).add(session_id)
            return
        if is_responder_session_id(session_id):
            initiator_session = session_id[: -len(".r")]
            if not self._store.is_consumed(message_id(initiator_session, 0)):
                # The initial message has not been taken in yet: wait for it (unacknowledged),
                # within bounds, so that a sender cannot fill our memory with such messages.
                self._park(message, session_id, expires=True)
                return
        log.info("dropping message %s for ended session %s", message.message_id, session_id)
        self.statistics.late_messages_dropped += 1
        self._settle_after_fence(message)

    def _kept_flow_for(self, session_id: str, sender: str) -> str | None:
        """The hospitalized flow that ``session_id`` belongs to but its checkpoint lacks.

        Session ids derive from flow ids, so the owner is known even when its checkpoint
        could not be read. None when there is no such flow.
        """
        if is_responder_session_id(session_id):
            initiator_session = session_id[: -len(".r")]
            flow_id = responder_flow_id(sender, initiator_session)
        else:
            flow_id = flow_id_of_session(session_id)
        runtime = self._flows.get(flow_id)
        if runtime is None or runtime.state.status is not FlowStatus.HOSPITALIZED:
            return None
        return flow_id if runtime.state.checkpoint.session(session_id) is None else None

    def _park(self, message: InboundMessage, session_id: str, *, expires: bool) -> bool:
        """Hold ``message`` until ``session_id`` opens; dead-letter it over the bounds."""
        parked = self._parked.setdefault(session_id, [])
        if len(parked) >= MAX_PARKED_PER_SESSION or self._parked_total >= MAX_PARKED:
            if not parked:
                del self._parked[session_id]
            self._dead_letter(
                message,
                f"too many messages waiting for session {session_id} to open "
                f"(at most {MAX_PARKED_PER_SESSION} per session, {MAX_PARKED} in all)",
            )
            return False
        parked.append(message)
        self._parked_total += 1
        if expires:
            self._parked_since.setdefault(session_id, self._clock.now())
        return True

    def _drop_held(self, flow_id: str) -> None:
        """Acknowledge the messages held for a kept flow that has now ended (late messages)."""
        for session_id in self._held_for.pop(flow_id, set()):
            for message in self._parked.pop(session_id, []):
                self._parked_total -= 1
                self.statistics.late_messages_dropped += 1
                self._settle_after_fence(message)

    def _index_sessions(self, runtime: _FlowRuntime) -> None:
        """Route messages for the flow's new sessions to it (O(new sessions), not O(all))."""
        state = runtime.state
        sessions = state.checkpoint.sessions
        start = runtime.indexed_sessions
        if len(sessions) == start:
            return
        if len(sessions) < start:  # not expected (sessions only grow): index them all again
            start = 0
        for session in sessions[start:]:
            if session.session_id not in self._session_owner:
                self._session_owner[session.session_id] = state.flow_id
                self._parked_since.pop(session.session_id, None)
                for parked in self._parked.pop(session.session_id, []):
                    self._parked_total -= 1
                    self._inbox.append(parked)
        runtime.indexed_sessions = len(sessions)

    def _take_in(self, message: InboundMessage) -> None:
        """Hold ``message``'s delivery until the transition that takes it in commits."""
        self._in_process[message.message_id] = [message]

    def _acknowledge(self, message_ids: Sequence[str], fenced: bool = True) -> None:
        """Settle every held delivery of each id.

        ``fenced``: a transaction that checked the node's lease committed after the decision
        (the executor's commit). Otherwise (a transition that only drops a duplicate) the
        deliveries are settled once a lease check has passed (:meth:`_settle_after_fence`).
        """
        for mid in message_ids:
            for delivery in self._in_process.pop(mid, ()):
                if fenced:
                    self._acknowledge_one(delivery)
                else:
                    self._settle_after_fence(delivery)

    def _settle_after_fence(self, message: InboundMessage) -> None:
        """Acknowledge ``message`` (dropped without being consumed) once the lease is checked.

        A process that was replaced without knowing it yet must not drop a message meant
        for its successor's flows: what a round drops is settled only after a transaction
        that checked the lease (the round's commit, or :meth:`CheckpointStore.check_lease`)
        has passed, after the decision.
        """
        if not self._unsettled:
            self._unsettled_mark = self.executor.transactions
        self._unsettled.append(message)

    def _settle_dropped(self) -> None:
        if not self._unsettled:
            return
        if self.executor.transactions == self._unsettled_mark:
            self._store.check_lease()  # no fenced commit since the decisions: check now
        dropped, self._unsettled = self._unsettled, []
        for message in dropped:
            self._acknowledge_one(message)

    # --- timers -------------------------------------------------------------------------

    def _schedule_wake_up(self, flow_id: str, deadline: float) -> None:
        # A flow waits on one thing at a time: its latest deadline replaces any earlier one,
        # whose heap entry becomes stale (skipped, and compacted away when they pile up).
        self._deadline_of[flow_id] = deadline
        self._timer_sequence += 1
        heapq.heappush(self._timers, (deadline, self._timer_sequence, flow_id))
        if len(self._timers) > 2 * len(self._deadline_of) + 1024:
            self._timers = [
                (due, number, owner)
                for due, number, owner in self._timers
                if self._deadline_of.get(owner) == due
            ]
            heapq.heapify(self._timers)

    def _drop_stale_timers(self) -> None:
        while self._timers:
            due, _, flow_id = self._timers[0]
            if self._deadline_of.get(flow_id) == due and flow_id in self._flows:
                return
            heapq.heappop(self._timers)

    def pending_timers(self) -> int:
        """Timer entries held (live or stale, before compaction): for tests and reports."""
        return len(self._timers)

    def next_deadline(self) -> float | None:
        """The earliest pending wake-up (or expiry of parked messages), or None."""
        self._drop_stale_timers()
        deadlines = [self._timers[0][0]] if self._timers else []
        for retries in (self._flow_retries, self._message_retries):
            if retries:
                deadlines.append(retries[0][0])
        if self._parked_since:
            deadlines.append(min(self._parked_since.values()) + PARKED_TIMEOUT_SECONDS)
        return min(deadlines) if deadlines else None

    def _expire_parked(self) -> bool:
        """Dead-letter messages whose session did not open within the timeout."""
        if not self._parked_since:
            return False
        cutoff = self._clock.now() - PARKED_TIMEOUT_SECONDS
        expired = [s for s, since in self._parked_since.items() if since <= cutoff]
        for session_id in expired:
            del self._parked_since[session_id]
            for message in self._parked.pop(session_id, []):
                self._parked_total -= 1
                reason = f"session {session_id} did not open within {PARKED_TIMEOUT_SECONDS:.0f} s"
                if self._failures is None:
                    self._dead_letter(message, reason)
                    continue
                try:
                    self._dead_letter(message, reason)
                except Exception as error:
                    self._message_failed(message, error)
        return bool(expired)

    def _fire_due_timers(self) -> bool:
        now = self._clock.now()
        fired = False
        self._drop_stale_timers()
        while self._timers and self._timers[0][0] <= now:
            _, _, flow_id = heapq.heappop(self._timers)
            del self._deadline_of[flow_id]
            self._queue_event(flow_id, WakeUp(now))
            fired = True
            self._drop_stale_timers()
        return fired

    # --- the round ----------------------------------------------------------------------

    def _queue_event(self, flow_id: str, event: Event) -> None:
        self._flows[flow_id].events.append(event)
        self._mark_ready(flow_id)

    def _mark_ready(self, flow_id: str) -> None:
        if flow_id in self._paused:
            self._paused_ready.add(flow_id)
            return
        if flow_id not in self._ready_set:
            self._ready_set.add(flow_id)
            self._ready.append(flow_id)

    def _set_continuation(self, runtime: _FlowRuntime, continuation: Continuation) -> None:
        if not isinstance(continuation, ProcessEvents):
            runtime.continuation = continuation
            self._mark_ready(runtime.state.flow_id)

    def has_work(self) -> bool:
        """True if a round would do something now (not counting future timers)."""
        if self._inbox or self._ready:
            return True
        now = self._clock.now()
        for due in (self._timers, self._flow_retries, self._message_retries):
            if due and due[0][0] <= now:
                return True
        return False

    def run_once(self) -> bool:
        """One round: route, transition, commit once, continue fibers. True if it did work."""
        did_work = self._fire_due_timers()
        did_work = self._retry_due() or did_work
        did_work = self._expire_parked() or did_work
        if self._inbox:
            self._route_all()
            did_work = True
        batch: list[tuple[str, tuple[Action, ...]]] = []
        to_continue: list[_FlowRuntime] = []
        awaiting: set[str] = set()  # flows with actions in the batch: their fibers wait
        while self._ready:
            flow_id = self._ready.popleft()
            self._ready_set.discard(flow_id)
            runtime = self._flows.get(flow_id)
            if runtime is None:
                continue
            if runtime.holding and not _kill_queued(runtime):
                continue
            did_work = True
            if self._failures is None:
                self._step_flow(runtime, batch, to_continue, awaiting)
                continue
            try:
                self._step_flow(runtime, batch, to_continue, awaiting)
            except Exception as error:
                self._flow_failed(runtime, error, _take_actions_of(flow_id, batch))
        if batch:
            for flow_id, failure in self._commit(batch).items():
                runtime = self._flows[flow_id]
                self._flow_failed(runtime, failure, [a for f, a in batch if f == flow_id])
            if self._failed_flows:
                self._forgive_flows_that_committed(batch)
        for runtime in to_continue:
            if runtime.holding or self._flows.get(runtime.state.flow_id) is not runtime:
                continue  # it failed this round
            if self._failures is None:
                self._continue(runtime)
                continue
            try:
                self._continue(runtime)
            except Exception as error:
                self._flow_failed(runtime, error, [])
        self._settle_dropped()
        return did_work

    def _step_flow(
        self,
        runtime: _FlowRuntime,
        batch: list[tuple[str, tuple[Action, ...]]],
        to_continue: list[_FlowRuntime],
        awaiting: set[str],
    ) -> None:
        """Feed the flow its queued events; run its fiber at once while nothing needs a commit.

        Once a transition of the flow has actions in the round's batch (``awaiting``), its
        fiber waits for the commit, also if the flow is stepped again in the same round.
        """
        flow_id = runtime.state.flow_id
        awaiting_commit = flow_id in awaiting
        while True:
            if runtime.continuation is not None and not awaiting_commit:
                if _kill_queued(runtime):
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
            result = transition(runtime.state, runtime.events.popleft())
            runtime.state = result.state
            self._index_sessions(runtime)
            if not isinstance(result.continuation, ProcessEvents):
                runtime.continuation = result.continuation
            if result.actions:
                batch.append((flow_id, result.actions))
                awaiting_commit = True
                awaiting.add(flow_id)
        if runtime.continuation is not None:
            to_continue.append(runtime)

    # --- failures pinned on one flow or one message ----------------------------------------

    def _commit(self, batch: list[tuple[str, tuple[Action, ...]]]) -> dict[str, Exception]:
        """Commit the round's actions in one transaction; on failure, find the flows at fault.

        A failed group commit is retried one flow per transaction: the flows whose
        transaction fails again are returned with their errors, the others are committed.
        Errors that are nobody's in particular propagate.
        """
        try:
            self.executor.execute([actions for _, actions in batch])
            return {}
        except AfterCommitError:
            raise
        except Exception as error:
            if self._failures is None or self._failures.is_node_wide(error):
                raise
            group_error = error
        by_flow: dict[str, list[tuple[Action, ...]]] = {}
        for flow_id, actions in batch:
            by_flow.setdefault(flow_id, []).append(actions)
        if len(by_flow) == 1:
            return {next(iter(by_flow)): group_error}
        failures: dict[str, Exception] = {}
        for flow_id, groups in by_flow.items():
            try:
                self.executor.execute(groups)
            except AfterCommitError:
                raise
            except Exception as error:
                if self._failures.is_node_wide(error):
                    raise
                failures[flow_id] = error
        return failures

    def _forgive_flows_that_committed(self, batch: list[tuple[str, tuple[Action, ...]]]) -> None:
        """Flows that failed before and have now committed a step start counting again."""
        assert self._failures is not None
        for flow_id, _ in batch:
            runtime = self._flows.get(flow_id)
            if flow_id in self._failed_flows and runtime is not None and not runtime.holding:
                self._failed_flows.discard(flow_id)
                self._failures.flow_recovered(flow_id)

    def _flow_failed(
        self, runtime: _FlowRuntime, error: Exception, actions: Sequence[tuple[Action, ...]]
    ) -> None:
        """Apply the policy to a failure pinned on ``runtime``'s flow (see the docstring)."""
        assert self._failures is not None
        flow_id = runtime.state.flow_id
        treatment = self._failures.flow_failed(flow_id, error)
        if treatment.action is FailureAction.RAISE:
            raise error
        self.statistics.failures_pinned += 1
        self._failed_flows.add(flow_id)
        log.warning(
            "flow %s: %s (rule %s): %s",
            flow_id,
            treatment.action.value,
            treatment.rule,
            treatment.reason,
            exc_info=treatment.rule == "unexplained",
        )
        self._hold(runtime, actions)
        if treatment.action is FailureAction.RETRY:
            runtime.retry_at = self._clock.now() + treatment.delay
            self._retry_sequence += 1
            heapq.heappush(self._flow_retries, (runtime.retry_at, self._retry_sequence, flow_id))
        elif treatment.action is FailureAction.KEEP:
            self._resume_from_checkpoint(flow_id, keep=treatment.reason)
        elif treatment.action is FailureAction.FAIL:
            assert treatment.error is not None
            self._resume_from_checkpoint(flow_id)
            if flow_id in self._flows:
                self.kill_flow(flow_id, treatment.reason, treatment.error)
            else:  # a responder that never committed: it ends as soon as it is created again
                self._fail_on_start[flow_id] = (treatment.reason, treatment.error)
        else:
            raise ValueError(f"{treatment.action} is not a treatment for a flow")

    def _hold(self, runtime: _FlowRuntime, actions: Sequence[tuple[Action, ...]]) -> None:
        """Stop a failed flow where it is; hold the deliveries it had taken in, raw."""
        if runtime.fiber is not None:
            runtime.fiber.abort()
            runtime.fiber = None
        runtime.continuation = None
        runtime.holding = True
        taken: list[str] = [r.message_id for r in runtime.state.unrecorded_inbound]
        for group in actions:
            for action in group:
                if isinstance(action, RecordInboundMessages):
                    taken.extend(r.message_id for r in action.records)
                elif isinstance(action, AcknowledgeMessages):
                    taken.extend(action.message_ids)
        kept_events: deque[Event] = deque()
        for event in runtime.events:
            if isinstance(event, DeliverSessionMessage):
                taken.append(event.message_id)
            elif isinstance(event, KillFlow):
                kept_events.append(event)
        runtime.events = kept_events
        for mid in dict.fromkeys(taken):
            for delivery in self._in_process.pop(mid, ()):
                _hold_message(runtime, delivery)
        flow_id = runtime.state.flow_id
        self._deadline_of.pop(flow_id, None)
        if flow_id in self._ready_set:
            self._ready_set.discard(flow_id)
            self._ready.remove(flow_id)

    def _retry_due(self) -> bool:
        """Resume failed flows and route failed messages whose delay has passed."""
        now = self._clock.now()
        did_work = False
        while self._flow_retries and self._flow_retries[0][0] <= now:
            due, _, flow_id = heapq.heappop(self._flow_retries)
            runtime = self._flows.get(flow_id)
            if runtime is not None and runtime.retry_at == due:
                self._resume_from_checkpoint(flow_id)
                did_work = True
        while self._message_retries and self._message_retries[0][0] <= now:
            _, _, message = heapq.heappop(self._message_retries)
            self._inbox.append(message)
            did_work = True
        return did_work

    def _resume_from_checkpoint(self, flow_id: str, keep: str | None = None) -> None:
        """Drop a failed flow's memory and restore it from its stored checkpoint.

        With ``keep`` (the reason), the flow is restored kept in the hospital: it does not
        run, and messages for it are taken in and buffered in its checkpoint, as for any
        kept flow. A flow that never committed (a responder whose first step failed) is
        forgotten and its held messages routed again: its initial message creates it again
        (with ``keep``, it then ends at once with the reason and its initiator is told).
        """
        runtime = self._flows[flow_id]
        held = list(runtime.held.values())
        events = [e for e in runtime.events if isinstance(e, KillFlow)]
        checkpoint = self._store.load_checkpoint(flow_id)
        self._forget_runtime(flow_id)
        self._inbox.extend(held)
        if checkpoint is None:
            if keep is not None:
                error = FlowError(ErrorKind.INTERNAL, KEPT_AFTER_FAILURES, keep)
                self._fail_on_start[flow_id] = (keep, error)
            return
        if keep is not None:
            error = FlowError(ErrorKind.INTERNAL, KEPT_AFTER_FAILURES, keep)
            checkpoint = attrs.evolve(checkpoint, status=FlowStatus.HOSPITALIZED, error=error)
        fresh = self._restore_one(checkpoint)
        fresh.events.extend(events)
        if events:
            self._mark_ready(flow_id)
        if keep is not None:
            self._store.mark_hospitalized(flow_id, keep)
            self.statistics.flows_hospitalized += 1
            log.error("flow %s kept in the hospital: %s", flow_id, keep)

    def _forget_runtime(self, flow_id: str) -> None:
        """Remove a flow's in-memory runtime and what points at it (not its checkpoint)."""
        runtime = self._flows.pop(flow_id, None)
        if runtime is None:
            return
        if runtime.fiber is not None:
            runtime.fiber.abort()
        for session in runtime.state.checkpoint.sessions:
            if self._session_owner.get(session.session_id) == flow_id:
                del self._session_owner[session.session_id]
        self._deadline_of.pop(flow_id, None)
        if flow_id in self._ready_set:
            self._ready_set.discard(flow_id)
            self._ready.remove(flow_id)

    def _message_failed(self, message: InboundMessage, error: Exception) -> None:
        """Apply the policy to a failure pinned on one inbound message."""
        assert self._failures is not None
        held = self._in_process.get(message.message_id)
        if held is not None and held[0] is message:
            del self._in_process[message.message_id]  # not taken in after all
        key = _message_key(message)
        treatment = self._failures.message_failed(key, error)
        if treatment.action is FailureAction.RAISE:
            raise error
        self.statistics.failures_pinned += 1
        self._failed_messages.add(key)
        log.warning(
            "message %s from %s: %s (rule %s): %s",
            message.message_id[:MAX_LOGGED_ID],
            message.sender[:MAX_LOGGED_ID],
            treatment.action.value,
            treatment.rule,
            treatment.reason,
            exc_info=treatment.rule == "unexplained",
        )
        if treatment.action is FailureAction.RETRY:
            self._retry_sequence += 1
            due = self._clock.now() + treatment.delay
            heapq.heappush(self._message_retries, (due, self._retry_sequence, message))
        elif treatment.action is FailureAction.QUARANTINE:
            self._failed_messages.discard(key)
            self._quarantine(message, treatment.reason)
        else:
            raise ValueError(f"{treatment.action} is not a treatment for a message")

    def _quarantine(self, message: InboundMessage, reason: str) -> None:
        """Dead-letter a message that keeps failing, with the reason, and acknowledge it.

        If even that fails (for a reason that is not node-wide), the message is left
        unacknowledged in the transport, out of the node's way, and logged: never lost.
        """
        assert self._failures is not None
        self.statistics.messages_quarantined += 1
        try:
            self._dead_letter(message, f"quarantined: {reason}")
        except Exception as error:
            if self._failures.is_node_wide(error):
                raise
            log.error(
                "message %s from %s could not be quarantined (%s: %s); left unacknowledged "
                "in the transport, set aside until the node restarts",
                message.message_id[:MAX_LOGGED_ID],
                message.sender[:MAX_LOGGED_ID],
                type(error).__name__,
                error,
            )

    def _continue(self, runtime: _FlowRuntime) -> None:
        continuation, runtime.continuation = runtime.continuation, None
        flow_id = runtime.state.flow_id
        if continuation is None or self._flows.get(flow_id) is not runtime:
            return
        if isinstance(continuation, Abort):
            self._abort(runtime)
            return
        if runtime.fiber is None:
            runtime.fiber = self._fibers.create(
                flow_id, runtime.state.checkpoint.origin, runtime.instance
            )
            runtime.instance = None
        if isinstance(continuation, Resume):
            outcome = runtime.fiber.resume(continuation.value)
        else:
            assert isinstance(continuation, Throw)
            outcome = runtime.fiber.throw(continuation.error)
        if isinstance(outcome, Returned):
            runtime.result = outcome.result
        self._queue_event(flow_id, self._event_for(outcome))
        if isinstance(outcome, Suspended) and self._on_boundary is not None:
            self._on_boundary("flow_suspended")
            if runtime.state.status is FlowStatus.REPLAYING:
                self._on_boundary("during_replay")

    def _event_for(self, outcome: FiberOutcome) -> Event:
        at = self._clock.now()
        if isinstance(outcome, Suspended):
            return Suspend(outcome.request, at)
        if isinstance(outcome, Returned):
            return FlowFinished(outcome.result, at)
        assert isinstance(outcome, Failed)
        return FlowFailed(outcome.error, at)

    def _abort(self, runtime: _FlowRuntime) -> None:
        state = runtime.state
        if runtime.fiber is not None:
            runtime.fiber.abort()
            runtime.fiber = None
        if state.status is FlowStatus.HOSPITALIZED:
            self.statistics.flows_hospitalized += 1
            log.error(
                "flow %s hospitalized: %s",
                state.flow_id,
                state.checkpoint.error.message if state.checkpoint.error else "",
            )
            return
        del self._flows[state.flow_id]
        self._deadline_of.pop(state.flow_id, None)
        self._drop_held(state.flow_id)
        self._paused.discard(state.flow_id)
        self._paused_ready.discard(state.flow_id)
        late = [e.message_id for e in runtime.events if isinstance(e, DeliverSessionMessage)]
        runtime.events.clear()
        self._acknowledge(late, fenced=False)
        for message in runtime.held.values():  # held for it: its sessions are over now
            self.statistics.late_messages_dropped += 1
            self._settle_after_fence(message)
        runtime.held = {}
        for session in state.checkpoint.sessions:
            self._session_owner.pop(session.session_id, None)
        end = FlowEnd(
            state.flow_id,
            state.checkpoint.flow_class,
            state.status,
            result=runtime.result,
            error=state.checkpoint.error,
        )
        if state.status is FlowStatus.COMPLETED:
            self.statistics.flows_completed += 1
        else:
            self.statistics.flows_failed += 1
        for listener in self._end_listeners:
            listener(end)

    # --- queries ------------------------------------------------------------------------

    def pause_flow(self, flow_id: str) -> None:
        """Stop running a live flow (its events wait) until :meth:`resume_flow`."""
        if flow_id not in self._flows:
            raise KeyError(f"flow {flow_id} is not running here (finished, or never was)")
        self._paused.add(flow_id)
        if flow_id in self._ready_set:
            self._ready_set.discard(flow_id)
            self._ready.remove(flow_id)
            self._paused_ready.add(flow_id)

    def resume_flow(self, flow_id: str) -> None:
        """Let a paused flow run again."""
        if flow_id not in self._paused:
            raise KeyError(f"flow {flow_id} is not paused")
        self._paused.discard(flow_id)
        if flow_id in self._paused_ready:
            self._paused_ready.discard(flow_id)
            self._mark_ready(flow_id)

    def paused(self) -> set[str]:
        """The flows paused now."""
        return set(self._paused)

    def retry_flow(self, checkpoint: Checkpoint) -> None:
        """Take a hospitalized flow out of the hospital: replay it from ``checkpoint``.

        ``checkpoint`` is the flow's stored checkpoint, read again (the code, or the stored
        blob, may have been fixed since). If replay still fails, it is hospitalized again.
        """
        runtime = self._flows.get(checkpoint.flow_id)
        if runtime is None or runtime.state.status is not FlowStatus.HOSPITALIZED:
            raise KeyError(f"flow {checkpoint.flow_id} is not in the hospital here")
        if checkpoint.status is FlowStatus.HOSPITALIZED:
            status = FlowStatus.SUSPENDED if checkpoint.pending else FlowStatus.RUNNABLE
            if not checkpoint.journal and checkpoint.pending is None:
                status = FlowStatus.UNSTARTED
            checkpoint = attrs.evolve(checkpoint, status=status, error=None)
        if runtime.fiber is not None:
            runtime.fiber.abort()
        del self._flows[checkpoint.flow_id]
        result = transition(None, RestoreFlow(checkpoint, self._clock.now()))
        fresh = _FlowRuntime(result.state)
        fresh.events.extend(runtime.events)
        self._inbox.extend(runtime.held.values())  # held for it: routed to it now
        self._flows[checkpoint.flow_id] = fresh
        self._held_for.pop(checkpoint.flow_id, None)  # indexing its sessions releases them
        self._index_sessions(fresh)
        self._set_continuation(fresh, result.continuation)
        if fresh.events:
            self._mark_ready(checkpoint.flow_id)

    def hospitalize(self, flow_id: str, error: FlowError) -> None:
        """Keep a live flow for observation (an operator retries or kills it); it does not run."""
        runtime = self._flows[flow_id]
        if runtime.fiber is not None:
            runtime.fiber.abort()
            runtime.fiber = None
        runtime.continuation = None
        checkpoint = attrs.evolve(
            runtime.state.checkpoint, status=FlowStatus.HOSPITALIZED, error=error
        )
        runtime.state = attrs.evolve(runtime.state, checkpoint=checkpoint)
        if flow_id in self._ready_set:
            self._ready_set.discard(flow_id)
            self._ready.remove(flow_id)
        self.statistics.flows_hospitalized += 1

    def kill_flow(self, flow_id: str, reason: str, error: FlowError | None = None) -> None:
        """End a live flow wherever it is (the next round does it); KeyError if not live.

        It ends with ``error``, or by default ``FlowKilledException`` with ``reason``.
        """
        runtime = self._flows.get(flow_id)
        if runtime is None:
            raise KeyError(f"flow {flow_id} is not running here (finished, or never was)")
        if runtime.retry_at is not None:
            # Waiting for a retry after a failure, its memory is ahead of its checkpoint:
            # the kill starts from the checkpoint.
            self._resume_from_checkpoint(flow_id)
            if flow_id not in self._flows:
                return  # it never committed: nothing is left to kill
        self._paused.discard(flow_id)  # a kill runs even if the flow was paused
        self._paused_ready.discard(flow_id)
        self._queue_event(flow_id, KillFlow(reason, self._clock.now(), error))

    def flow_state(self, flow_id: str) -> FlowState | None:
        """The in-memory state of a live (or hospitalized) flow."""
        runtime = self._flows.get(flow_id)
        return None if runtime is None else runtime.state

    def live_flows(self) -> list[FlowState]:
        """States of every flow this manager holds, in start order."""
        return [runtime.state for runtime in self._flows.values()]

    def parked_message_count(self) -> int:
        """Messages waiting for a session that has not been opened yet."""
        return sum(len(messages) for messages in self._parked.values())


KEPT_AFTER_FAILURES = "flows.errors.FlowFailedError"
"""The error class recorded for a flow kept in the hospital after failures."""
MAX_LOGGED_ID = 200
"""Characters of an inbound id or sender shown in a log line (they come from outside)."""


def _hold_message(runtime: _FlowRuntime, message: InboundMessage) -> None:
    """Hold ``message`` (unacknowledged) for a flow waiting for its retry."""
    runtime.held[(message.message_id, message.sender)] = message


def _kill_queued(runtime: _FlowRuntime) -> bool:
    return any(isinstance(event, KillFlow) for event in runtime.events)


def _take_actions_of(
    flow_id: str, batch: list[tuple[str, tuple[Action, ...]]]
) -> list[tuple[Action, ...]]:
    """Remove ``flow_id``'s actions from the round's batch; returns them."""
    mine = [actions for owner, actions in batch if owner == flow_id]
    batch[:] = [(owner, actions) for owner, actions in batch if owner != flow_id]
    return mine


def _message_key(message: InboundMessage) -> str:
    """What identifies a message across its deliveries (id, sender and contents)."""
    digest = hashlib.sha256()
    for part in (message.message_id.encode(), message.sender.encode(), message.data):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
