"""The transition function: ``transition(state, event) -> TransitionResult``.

Rules of this module (everything that decides what a flow does lives here and in
:mod:`statemachine.session_ops`):

* It is pure. It reads its arguments, builds new frozen values and returns them. No I/O, no
  clock, no randomness: the time comes in on the event, random values come in as candidates.
* Regular transitions live in the table ``TRANSITIONS``, keyed by ``(status, event type)``;
  a status of ``None`` is a flow that does not exist yet. A pair missing from the table
  raises :class:`IllegalTransitionError` naming the flow, its status and the event.
* A live flow commits (checkpoint, dedup ids, outbox) only when it blocks, finishes, fails,
  or has done enough requests since its last commit (:func:`commit_due`: at least
  ``MAX_UNCOMMITTED_STEPS``, and at least a ``1 / COMMIT_GROWTH_DIVISOR`` share of its
  checkpoint's entries, so a flow that grows without blocking encodes O(final size) bytes in
  all, not O(size) every 32 steps). Between commits it runs on without touching the
  database: nothing it did is visible outside until the commit, so a crash simply replays it
  from the last checkpoint.
* A restored flow is REPLAYING: each request is answered from the journal and must match the
  journal's signature; a mismatch sends the flow to the hospital (kept, never lost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from statemachine.actions import (
    AcknowledgeMessages,
    Action,
    HandOffMessages,
    PersistCheckpoint,
    RecordInboundMessages,
    RemoveCheckpoint,
    RunFlowEffects,
    ScheduleWakeUp,
    StoreFlowError,
    StoreFlowResult,
    WriteOutbox,
)
from statemachine.errors import IllegalTransitionError
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
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import (
    CloseSessions,
    InitiateSession,
    IORequest,
    Plain,
    Receive,
    RecordValue,
    RunInTransaction,
    Send,
    SetProgress,
    Sleep,
)
from statemachine.result import (
    Abort,
    ProcessEvents,
    Resume,
    TransitionResult,
    continuation_for,
)
from statemachine.session_messages import (
    ExistingSessionMessage,
    InboundRecord,
    InitialSessionMessage,
    OutboundSessionMessage,
    SessionReject,
    message_id,
    responder_session_id,
)
from statemachine.session_ops import (
    close_sessions,
    confirm_session,
    end_all_sessions,
    ensure_initiated,
    open_session,
    receive_after_delivery,
    receive_progress,
    responder_session,
    send_payloads,
    take_in,
    try_receive,
)
from statemachine.state import (
    Checkpoint,
    FlowState,
    FlowStatus,
    InitiatedBy,
    JournalEntry,
    Outcome,
    Pending,
    Raised,
    Value,
)

FLOW_TIMEOUT_EXCEPTION = "flows.errors.FlowTimeoutException"
"""The exception a flow gets when a receive outlives its timeout."""

FLOW_KILLED_EXCEPTION = "flows.errors.FlowKilledException"
"""The error a killed flow's handle raises."""

MAX_UNCOMMITTED_STEPS = 32
"""A live flow that keeps running without blocking commits after at least this many requests."""

COMMIT_GROWTH_DIVISOR = 4
"""...and after at least its checkpoint's entries (journal entries plus sessions) divided by
this: each commit then comes once the checkpoint has grown by a third since the previous one,
so the bytes encoded by all commits of a flow are a small multiple of its final checkpoint."""

Handler = Callable[[Any, Any], TransitionResult]


def transition(state: FlowState | None, event: Event) -> TransitionResult:
    """Decide what ``event`` does to the flow in ``state`` (None for a flow not yet created)."""
    status = None if state is None else state.status
    handler = TRANSITIONS.get((status, type(event)))
    if handler is None:
        flow_id = _flow_id_of(state, event)
        raise IllegalTransitionError(flow_id, "NEW" if status is None else status.value, event)
    return handler(state, event)


def _flow_id_of(state: FlowState | None, event: Event) -> str:
    if state is not None:
        return state.flow_id
    if isinstance(event, RestoreFlow):
        return event.checkpoint.flow_id
    return str(getattr(event, "flow_id", "?"))


# --- committing -----------------------------------------------------------------------------


def _commit(state: FlowState, at: float) -> tuple[FlowState, tuple[Action, ...]]:
    """Persist the checkpoint with everything since the last commit; clear the pending work.

    Each commit of a flow's checkpoint has the next version (bound into its MAC by the
    store, so an older checkpoint put back is told from the newest).
    """
    checkpoint = attrs.evolve(state.checkpoint, version=state.checkpoint.version + 1)
    state = attrs.evolve(state, checkpoint=checkpoint)
    in_transaction: list[Action] = [PersistCheckpoint(checkpoint, at)]
    after_commit: list[Action] = []
    in_transaction.extend(_record_and_send(state, at, after_commit))
    return _clean(state), tuple(in_transaction + after_commit)


def commit_due(state: FlowState) -> bool:
    """True if a live flow that has not blocked has run long enough to commit now."""
    checkpoint = state.checkpoint
    entries = len(checkpoint.journal) + len(checkpoint.sessions)
    due = max(MAX_UNCOMMITTED_STEPS, entries // COMMIT_GROWTH_DIVISOR)
    return state.uncommitted_steps >= due


def _clean(state: FlowState) -> FlowState:
    """``state`` once everything since the last commit is in the transaction's actions."""
    return attrs.evolve(
        state, unrecorded_inbound=(), unsent_outbound=(), unrun_effects=(), uncommitted_steps=0
    )


def _record_and_send(state: FlowState, at: float, after_commit: list[Action]) -> list[Action]:
    """The dedup-id and outbox actions (and their after-commit halves) for ``state``."""
    actions: list[Action] = []
    if state.unrecorded_inbound:
        records = tuple(state.unrecorded_inbound)
        actions.append(RecordInboundMessages(records, at))
        after_commit.append(AcknowledgeMessages(tuple(r.message_id for r in records)))
    if state.unsent_outbound:
        outbound = tuple(state.unsent_outbound)
        actions.append(WriteOutbox(outbound, at))
        after_commit.append(HandOffMessages(outbound))
    if state.unrun_effects:
        actions.append(RunFlowEffects(state.flow_id, tuple(state.unrun_effects)))
    return actions


def _with_status(state: FlowState, status: FlowStatus, **changes: Any) -> FlowState:
    return attrs.evolve(state, checkpoint=attrs.evolve(state.checkpoint, status=status, **changes))


def _journal(state: FlowState, request: IORequest, outcome: Outcome) -> FlowState:
    entry = JournalEntry(request.signature(), outcome)
    checkpoint = attrs.evolve(state.checkpoint, journal=state.checkpoint.journal.append(entry))
    return attrs.evolve(
        state,
        checkpoint=checkpoint,
        replay_cursor=len(checkpoint.journal),
        uncommitted_steps=state.uncommitted_steps + 1,
    )


def _complete(
    state: FlowState, request: IORequest, outcome: Outcome, at: float
) -> TransitionResult:
    """Journal a completed request and resume the fiber, committing only if overdue."""
    state = _journal(_with_status(state, FlowStatus.RUNNABLE, pending=None), request, outcome)
    if state.receive_progress is not None:
        state = attrs.evolve(state, receive_progress=None)
    actions: tuple[Action, ...] = ()
    if commit_due(state):
        state, actions = _commit(state, at)
    return TransitionResult(state, actions, continuation_for(outcome))


def _block(state: FlowState, pending: Pending, at: float) -> TransitionResult:
    """Suspend the flow on ``pending``: commit, and arrange a wake-up if it has a deadline."""
    progress = None
    if isinstance(pending.request, Receive):
        progress = receive_progress(state, pending.request)
    state = attrs.evolve(state, receive_progress=progress)
    state, actions = _commit(_with_status(state, FlowStatus.SUSPENDED, pending=pending), at)
    if pending.deadline is not None:
        actions = (*actions, ScheduleWakeUp(state.flow_id, pending.deadline))
    return TransitionResult(state, actions, ProcessEvents())


# --- creating a flow ------------------------------------------------------------------------


def _start_flow(_: None, event: StartFlow) -> TransitionResult:
    checkpoint = Checkpoint(
        flow_id=event.flow_id,
        origin=event.origin,
        status=FlowStatus.UNSTARTED,
        created_at=event.at,
        session_tag=event.session_tag,
        version=1,
    )
    actions: tuple[Action, ...] = (PersistCheckpoint(checkpoint, event.at),)
    state = FlowState(checkpoint=attrs.evolve(checkpoint, status=FlowStatus.RUNNABLE))
    return TransitionResult(state, actions, Resume(None))


def _start_initiated_flow(_: None, event: StartInitiatedFlow) -> TransitionResult:
    session = responder_session(event.initial, event.sender, event.flow_version, event.app_name)
    checkpoint = Checkpoint(
        flow_id=event.flow_id,
        origin=InitiatedBy(
            event.flow_class,
            session.session_id,
            event.sender,
            event.initial.flow_version,
            event.initial.app_name,
        ),
        status=FlowStatus.RUNNABLE,
        created_at=event.at,
        sessions=(session,),
        session_tag=event.session_tag,
    )
    record = InboundRecord(event.message_id, event.sender, session.session_id, 0)
    state = FlowState(checkpoint=checkpoint, unrecorded_inbound=(record,), uncommitted_steps=1)
    state = confirm_session(state, session.session_id)
    return TransitionResult(state, (), Resume(None))


def _restore_flow(_: None, event: RestoreFlow) -> TransitionResult:
    checkpoint = event.checkpoint
    if checkpoint.status is FlowStatus.HOSPITALIZED:
        return TransitionResult(FlowState(checkpoint, len(checkpoint.journal)), (), ProcessEvents())
    if checkpoint.status not in (FlowStatus.UNSTARTED, FlowStatus.RUNNABLE, FlowStatus.SUSPENDED):
        raise IllegalTransitionError(checkpoint.flow_id, checkpoint.status.value, event)
    replaying = bool(checkpoint.journal) or checkpoint.pending is not None
    status = FlowStatus.REPLAYING if replaying else FlowStatus.RUNNABLE
    state = FlowState(attrs.evolve(checkpoint, status=status), replay_cursor=0)
    return TransitionResult(state, (), Resume(None))


def reject_initial_session(
    initial_message_id: str, sender: str, initial: InitialSessionMessage, reason: str, at: float
) -> tuple[Action, ...]:
    """Actions that refuse a peer's session when no responder can be started for it."""
    our_session = responder_session_id(initial.initiator_session_id)
    reply = OutboundSessionMessage(
        message_id(our_session, 0),
        sender,
        ExistingSessionMessage(initial.initiator_session_id, 0, SessionReject(reason)),
    )
    record = InboundRecord(initial_message_id, sender, our_session, 0)
    return (
        RecordInboundMessages((record,), at),
        WriteOutbox((reply,), at),
        AcknowledgeMessages((initial_message_id,)),
        HandOffMessages((reply,)),
    )


# --- a live flow asks for something ---------------------------------------------------------


def _suspend_live(state: FlowState, event: Suspend) -> TransitionResult:
    request, at = event.request, event.at
    if isinstance(request, Receive):
        return _receive(state, request, at)
    if isinstance(request, Sleep):
        return _sleep(state, request, at, at + request.seconds)
    outcome: Outcome
    if isinstance(request, InitiateSession):
        state, outcome = open_session(state, request)
    elif isinstance(request, Send):
        state, outcome = send_payloads(state, request.payloads)
    elif isinstance(request, CloseSessions):
        state, outcome = close_sessions(state, request.session_ids)
    elif isinstance(request, SetProgress):
        state = attrs.evolve(
            state, checkpoint=attrs.evolve(state.checkpoint, progress_step=request.step)
        )
        outcome = Value(None)
    elif isinstance(request, RunInTransaction):
        state = attrs.evolve(state, unrun_effects=state.unrun_effects.append(request.ordinal))
        outcome = Value(None)
    else:
        assert isinstance(request, RecordValue)
        outcome = Value(request.candidate)
    return _complete(state, request, outcome, at)


def _receive(
    state: FlowState, request: Receive, at: float, deadline: float | None = None
) -> TransitionResult:
    state = ensure_initiated(state, request.session_ids)
    state, outcome = try_receive(state, request)
    if outcome is None:
        if deadline is None and request.timeout is not None:
            deadline = at + request.timeout
        return _block(state, Pending(request, deadline), at)
    return _complete(state, request, outcome, at)


def _sleep(state: FlowState, request: Sleep, at: float, deadline: float) -> TransitionResult:
    if at >= deadline:
        return _complete(state, request, Value(None), at)
    return _block(state, Pending(request, deadline), at)


# --- replay ---------------------------------------------------------------------------------


def _suspend_replaying(state: FlowState, event: Suspend) -> TransitionResult:
    checkpoint, cursor, request = state.checkpoint, state.replay_cursor, event.request
    if cursor < len(checkpoint.journal):
        entry = checkpoint.journal[cursor]
        if entry.signature != request.signature():
            return _hospitalize_divergence(
                state, cursor + 1, _describe(entry.signature), request.describe(), event.at
            )
        state = attrs.evolve(state, replay_cursor=cursor + 1)
        if state.replay_cursor == len(checkpoint.journal) and checkpoint.pending is None:
            state = _with_status(state, FlowStatus.RUNNABLE)
        return TransitionResult(state, (), continuation_for(entry.outcome))
    pending = checkpoint.pending
    assert pending is not None, "a replaying flow with its journal exhausted must be pending"
    if pending.request.signature() != request.signature():
        return _hospitalize_divergence(
            state, cursor + 1, pending.request.describe(), request.describe(), event.at
        )
    state = _with_status(state, FlowStatus.RUNNABLE, pending=None)
    if isinstance(request, Sleep):
        assert pending.deadline is not None
        return _sleep(state, request, event.at, pending.deadline)
    assert isinstance(request, Receive) and isinstance(pending.request, Receive)
    # The deadline is the one first set (durable), not one counted again from now.
    return _receive(state, pending.request, event.at, pending.deadline)


def _finish_replaying(state: FlowState, event: FlowFinished | FlowFailed) -> TransitionResult:
    checkpoint = state.checkpoint
    if state.replay_cursor < len(checkpoint.journal):
        expected = _describe(checkpoint.journal[state.replay_cursor].signature)
    else:
        assert checkpoint.pending is not None
        expected = checkpoint.pending.request.describe()
    ended = "returned" if isinstance(event, FlowFinished) else f"raised ({event.error.message})"
    return _hospitalize_divergence(
        state, state.replay_cursor + 1, expected, f"call() {ended}", event.at
    )


def _describe(signature: tuple[Plain, ...]) -> str:
    kind, *details = signature
    name = kind if isinstance(kind, str) else repr(kind)
    return f"{name}({', '.join(repr(d) for d in details)})"


def _hospitalize_divergence(
    state: FlowState, step: int, expected: str, got: str, at: float
) -> TransitionResult:
    message = (
        f"flow {state.flow_id} ({state.checkpoint.flow_class}) is not deterministic: at step "
        f"{step} its journal has {expected} but on replay it asked for {got}"
    )
    error = FlowError(ErrorKind.NON_DETERMINISM, "", message)
    state = _with_status(state, FlowStatus.HOSPITALIZED, error=error)
    state, actions = _commit(state, at)
    return TransitionResult(state, actions, Abort(message))


# --- messages and timers --------------------------------------------------------------------


def _deliver(state: FlowState, event: DeliverSessionMessage) -> TransitionResult:
    record = InboundRecord(event.message_id, event.sender, event.session_id, event.sequence)
    state, accepted = take_in(state, event.session_id, record, event.body)
    if not accepted:
        return TransitionResult(state, (AcknowledgeMessages((event.message_id,)),), ProcessEvents())
    pending = state.checkpoint.pending
    if (
        state.status is FlowStatus.SUSPENDED
        and pending is not None
        and isinstance(pending.request, Receive)
    ):
        state, outcome = receive_after_delivery(state, pending.request, event.session_id)
        if outcome is not None:
            return _complete(state, pending.request, outcome, event.at)
    if state.status is FlowStatus.HOSPITALIZED:
        state, actions = _commit(state, event.at)
        return TransitionResult(state, actions, ProcessEvents())
    return TransitionResult(state, (), ProcessEvents())


def _wake_up(state: FlowState, event: WakeUp) -> TransitionResult:
    pending = state.checkpoint.pending
    if pending is None or pending.deadline is None or event.at < pending.deadline:
        return TransitionResult(state, (), ProcessEvents())
    request = pending.request
    if isinstance(request, Receive):
        sessions = ", ".join(request.session_ids)
        error = FlowError(
            ErrorKind.FLOW_EXCEPTION,
            FLOW_TIMEOUT_EXCEPTION,
            f"no message on {sessions} within {request.timeout:g} s",
        )
        return _complete(state, request, Raised(error), event.at)
    assert isinstance(request, Sleep)
    return _complete(state, request, Value(None), event.at)


def _drop_late_message(state: FlowState, event: DeliverSessionMessage) -> TransitionResult:
    """A message for a flow that has just ended: nothing will read it."""
    return TransitionResult(state, (AcknowledgeMessages((event.message_id,)),), ProcessEvents())


def _ignore(state: FlowState, _: Event) -> TransitionResult:
    return TransitionResult(state, (), ProcessEvents())


# --- the end --------------------------------------------------------------------------------


def _finish(state: FlowState, event: FlowFinished) -> TransitionResult:
    state = end_all_sessions(state, None)
    state = _with_status(state, FlowStatus.COMPLETED)
    flow_id, flow_class = state.flow_id, state.checkpoint.flow_class
    after_commit: list[Action] = []
    actions: list[Action] = [
        RemoveCheckpoint(flow_id),
        StoreFlowResult(flow_id, flow_class, event.result, event.at),
    ]
    actions.extend(_record_and_send(state, event.at, after_commit))
    return TransitionResult(_clean(state), tuple(actions + after_commit), Abort("completed"))


def _fail(state: FlowState, event: FlowFailed) -> TransitionResult:
    told_peers = event.error
    if told_peers.kind is not ErrorKind.FLOW_EXCEPTION:
        told_peers = FlowError(ErrorKind.UNEXPECTED_END, "", "", told_peers.error_id)
    state = end_all_sessions(state, told_peers)
    state = _with_status(state, FlowStatus.FAILED, error=event.error)
    flow_id, flow_class = state.flow_id, state.checkpoint.flow_class
    after_commit: list[Action] = []
    actions: list[Action] = [
        RemoveCheckpoint(flow_id),
        StoreFlowError(flow_id, flow_class, event.error, event.at),
    ]
    actions.extend(_record_and_send(state, event.at, after_commit))
    return TransitionResult(_clean(state), tuple(actions + after_commit), Abort("failed"))


def _kill(state: FlowState, event: KillFlow) -> TransitionResult:
    """End the flow as failed with ``FlowKilledException``; peers see an unexpected end."""
    error = event.error or FlowError(ErrorKind.INTERNAL, FLOW_KILLED_EXCEPTION, event.reason)
    return _fail(state, FlowFailed(error, event.at))


# --- the table ------------------------------------------------------------------------------

_S = FlowStatus
TRANSITIONS: dict[tuple[FlowStatus | None, type], Handler] = {
    (None, StartFlow): _start_flow,
    (None, StartInitiatedFlow): _start_initiated_flow,
    (None, RestoreFlow): _restore_flow,
    (_S.RUNNABLE, Suspend): _suspend_live,
    (_S.REPLAYING, Suspend): _suspend_replaying,
    (_S.RUNNABLE, DeliverSessionMessage): _deliver,
    (_S.REPLAYING, DeliverSessionMessage): _deliver,
    (_S.SUSPENDED, DeliverSessionMessage): _deliver,
    (_S.HOSPITALIZED, DeliverSessionMessage): _deliver,
    (_S.SUSPENDED, WakeUp): _wake_up,
    (_S.RUNNABLE, WakeUp): _ignore,
    (_S.REPLAYING, WakeUp): _ignore,
    (_S.HOSPITALIZED, WakeUp): _ignore,
    (_S.COMPLETED, WakeUp): _ignore,
    (_S.FAILED, WakeUp): _ignore,
    (_S.COMPLETED, DeliverSessionMessage): _drop_late_message,
    (_S.FAILED, DeliverSessionMessage): _drop_late_message,
    (_S.RUNNABLE, FlowFinished): _finish,
    (_S.RUNNABLE, FlowFailed): _fail,
    (_S.REPLAYING, FlowFinished): _finish_replaying,
    (_S.REPLAYING, FlowFailed): _finish_replaying,
    (_S.RUNNABLE, KillFlow): _kill,
    (_S.SUSPENDED, KillFlow): _kill,
    (_S.REPLAYING, KillFlow): _kill,
    (_S.HOSPITALIZED, KillFlow): _kill,
    (_S.COMPLETED, KillFlow): _ignore,
    (_S.FAILED, KillFlow): _ignore,
}
"""Every legal (status, event kind) pair and the rule that handles it."""
