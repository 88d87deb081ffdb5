"""Rules for a live flow that asks for something, by request kind (the ``REQUESTS`` table).

Blocking requests (receive with nothing to receive, sleep before its deadline) suspend the
flow and commit; the others are journaled and the flow resumes at once, committing only when
it is overdue (:func:`~statemachine.transitions.committing.commit_due`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statemachine.events import Suspend
from statemachine.immutable import replace
from statemachine.iorequests import (
    CloseSessions,
    ContinueAsNew,
    InitiateSession,
    IORequest,
    Receive,
    RecordValue,
    RunInTransaction,
    RunOperation,
    Send,
    SetProgress,
    Sleep,
)
from statemachine.result import TransitionResult
from statemachine.session_ops import (
    close_sessions,
    ensure_initiated,
    open_session,
    send_payloads,
    try_receive,
)
from statemachine.state import NO_VALUE, FlowState, Outcome, Pending, Value
from statemachine.transitions.committing import block, complete
from statemachine.transitions.continuing import continue_as_new
from statemachine.transitions.external_operations import run_operation

RequestRule = Callable[[FlowState, Any, float], TransitionResult]
"""A rule for one request kind: ``(state, request, at) -> result``."""


def suspend_live(state: FlowState, event: Suspend) -> TransitionResult:
    """A live flow asks for something: the rule for the request's kind decides."""
    rule = REQUESTS.get(type(event.request))
    if rule is None:
        raise TypeError(f"flow {state.flow_id}: no rule for request {event.request!r}")
    return rule(state, event.request, event.at)


def receive(
    state: FlowState,
    request: Receive,
    at: float,
    deadline: float | None = None,
    stored: Pending | None = None,
) -> TransitionResult:
    """Complete the receive if every session has a message, else block until they do.

    ``deadline`` is the one first set when the receive blocked (durable: a replayed receive
    keeps it); otherwise the request's timeout counts from ``at``. ``stored`` is the pending
    request of a restored flow's checkpoint (see :func:`block`).
    """
    state = ensure_initiated(state, request.session_ids)
    state, outcome = try_receive(state, request)
    if outcome is None:
        if deadline is None and request.timeout is not None:
            deadline = at + request.timeout
        return block(state, Pending(request, deadline), at, stored)
    return complete(state, request, outcome, at)


def sleep(
    state: FlowState, request: Sleep, at: float, deadline: float, stored: Pending | None = None
) -> TransitionResult:
    """Resume at once if ``deadline`` has passed, else block until it does."""
    if at >= deadline:
        return complete(state, request, NO_VALUE, at)
    return block(state, Pending(request, deadline), at, stored)


def _receive(state: FlowState, request: Receive, at: float) -> TransitionResult:
    return receive(state, request, at)


def _sleep(state: FlowState, request: Sleep, at: float) -> TransitionResult:
    return sleep(state, request, at, at + request.seconds)


def _journaled(
    change: Callable[[FlowState, Any], tuple[FlowState, Outcome]],
) -> RequestRule:
    """A rule for a request that never blocks: change the state, journal, resume."""

    def rule(state: FlowState, request: IORequest, at: float) -> TransitionResult:
        state, outcome = change(state, request)
        return complete(state, request, outcome, at)

    return rule


def _open(state: FlowState, request: InitiateSession) -> tuple[FlowState, Outcome]:
    return open_session(state, request)


def _send(state: FlowState, request: Send) -> tuple[FlowState, Outcome]:
    return send_payloads(state, request.payloads)


def _close(state: FlowState, request: CloseSessions) -> tuple[FlowState, Outcome]:
    return close_sessions(state, request.session_ids)


def _progress(state: FlowState, request: SetProgress) -> tuple[FlowState, Outcome]:
    checkpoint = replace(state.checkpoint, progress_step=request.step)
    return replace(state, checkpoint=checkpoint), NO_VALUE


def _effect(state: FlowState, request: RunInTransaction) -> tuple[FlowState, Outcome]:
    return replace(state, unrun_effects=state.unrun_effects.append(request.ordinal)), NO_VALUE


def _value(state: FlowState, request: RecordValue) -> tuple[FlowState, Outcome]:
    return state, Value(request.candidate)


REQUESTS: dict[type, RequestRule] = {
    Receive: _receive,
    Sleep: _sleep,
    RunOperation: run_operation,
    InitiateSession: _journaled(_open),
    Send: _journaled(_send),
    CloseSessions: _journaled(_close),
    SetProgress: _journaled(_progress),
    RunInTransaction: _journaled(_effect),
    RecordValue: _journaled(_value),
    ContinueAsNew: continue_as_new,
}
"""The rule for each kind of request a live flow makes."""
