"""Rules for what reaches a flow from outside: a session message, a timer."""

from __future__ import annotations

from statemachine.actions import AcknowledgeMessages
from statemachine.events import DeliverSessionMessage, Event, WakeUp
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import Receive, RunOperation, Sleep
from statemachine.result import ProcessEvents, TransitionResult
from statemachine.session_messages import InboundRecord
from statemachine.session_ops import receive_after_delivery, take_in
from statemachine.state import NO_VALUE, FlowState, FlowStatus, Raised
from statemachine.transitions.committing import commit, complete
from statemachine.transitions.external_operations import operation_wake_up

FLOW_TIMEOUT_EXCEPTION = "flows.errors.FlowTimeoutException"
"""The exception a flow gets when a receive outlives its timeout."""


def deliver(state: FlowState, event: DeliverSessionMessage) -> TransitionResult:
    """Take a message into its session; complete the receive it answers, if any."""
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
            return complete(state, pending.request, outcome, event.at)
    if state.status is FlowStatus.HOSPITALIZED:
        state, actions = commit(state, event.at)
        return TransitionResult(state, actions, ProcessEvents())
    return TransitionResult(state, (), ProcessEvents())


def wake_up(state: FlowState, event: WakeUp) -> TransitionResult:
    """A deadline passed: a sleep ends, a receive or an operation times out, a retry is due."""
    pending = state.checkpoint.pending
    if pending is None or pending.deadline is None or event.at < pending.deadline:
        return TransitionResult(state, (), ProcessEvents())
    request = pending.request
    if isinstance(request, RunOperation):
        return operation_wake_up(state, request, event)
    if isinstance(request, Receive):
        sessions = ", ".join(request.session_ids)
        error = FlowError(
            ErrorKind.FLOW_EXCEPTION,
            FLOW_TIMEOUT_EXCEPTION,
            f"no message on {sessions} within {request.timeout:g} s",
        )
        return complete(state, request, Raised(error), event.at)
    assert isinstance(request, Sleep)
    return complete(state, request, NO_VALUE, event.at)


def drop_late_message(state: FlowState, event: DeliverSessionMessage) -> TransitionResult:
    """A message for a flow that has just ended: nothing will read it."""
    return TransitionResult(state, (AcknowledgeMessages((event.message_id,)),), ProcessEvents())


def ignore(state: FlowState, _: Event) -> TransitionResult:
    """Nothing to do for this event in this status."""
    return TransitionResult(state, (), ProcessEvents())
