"""Rules for a restored flow: each request is answered from the journal, and must match it."""

from __future__ import annotations

from statemachine.events import FlowFailed, FlowFinished, Suspend
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.immutable import replace
from statemachine.iorequests import Plain, Receive, RunOperation, Sleep
from statemachine.result import Abort, TransitionResult, continuation_for
from statemachine.state import FlowState, FlowStatus
from statemachine.transitions.committing import commit, with_status
from statemachine.transitions.external_operations import resume_operation
from statemachine.transitions.requests import receive, sleep


def suspend_replaying(state: FlowState, event: Suspend) -> TransitionResult:
    """Answer the request from the journal; once it runs out, the flow is live again."""
    checkpoint, cursor, request = state.checkpoint, state.replay_cursor, event.request
    if cursor < len(checkpoint.journal):
        entry = checkpoint.journal[cursor]
        if entry.signature != request.signature():
            return hospitalize_divergence(
                state, cursor + 1, _describe(entry.signature), request.describe(), event.at
            )
        state = replace(state, replay_cursor=cursor + 1)
        if state.replay_cursor == len(checkpoint.journal) and checkpoint.pending is None:
            state = with_status(state, FlowStatus.RUNNABLE)
        return TransitionResult(state, (), continuation_for(entry.outcome))
    pending = checkpoint.pending
    assert pending is not None, "a replaying flow with its journal exhausted must be pending"
    if pending.request.signature() != request.signature():
        return hospitalize_divergence(
            state, cursor + 1, pending.request.describe(), request.describe(), event.at
        )
    state = with_status(state, FlowStatus.RUNNABLE, pending=None)
    if isinstance(request, Sleep):
        assert pending.deadline is not None
        return sleep(state, request, event.at, pending.deadline, pending)
    if isinstance(request, RunOperation):
        return resume_operation(state, request, pending, event.at)
    assert isinstance(request, Receive) and isinstance(pending.request, Receive)
    # The deadline is the one first set (durable), not one counted again from now; if the
    # flow still waits for what its checkpoint says, nothing is written.
    return receive(state, pending.request, event.at, pending.deadline, pending)


def finish_replaying(state: FlowState, event: FlowFinished | FlowFailed) -> TransitionResult:
    """``call()`` ended before its journal did: the flow is not deterministic."""
    checkpoint = state.checkpoint
    if state.replay_cursor < len(checkpoint.journal):
        expected = _describe(checkpoint.journal[state.replay_cursor].signature)
    else:
        assert checkpoint.pending is not None
        expected = checkpoint.pending.request.describe()
    ended = "returned" if isinstance(event, FlowFinished) else f"raised ({event.error.message})"
    return hospitalize_divergence(
        state, state.replay_cursor + 1, expected, f"call() {ended}", event.at
    )


def _describe(signature: tuple[Plain, ...]) -> str:
    kind, *details = signature
    name = kind if isinstance(kind, str) else repr(kind)
    return f"{name}({', '.join(repr(d) for d in details)})"


def hospitalize_divergence(
    state: FlowState, step: int, expected: str, got: str, at: float
) -> TransitionResult:
    """Keep a flow whose replay asked for something else than its journal at ``step``."""
    message = (
        f"flow {state.flow_id} ({state.checkpoint.flow_class}) is not deterministic: at step "
        f"{step} its journal has {expected} but on replay it asked for {got}"
    )
    error = FlowError(ErrorKind.NON_DETERMINISM, "", message)
    state = with_status(state, FlowStatus.HOSPITALIZED, error=error)
    state, actions = commit(state, at)
    return TransitionResult(state, actions, Abort(message))
