"""Rules that end a flow: it returned, it raised, or it was killed."""

from __future__ import annotations

from statemachine.actions import Action, RemoveCheckpoint, StoreFlowError, StoreFlowResult
from statemachine.events import FlowFailed, FlowFinished, KillFlow
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.result import Abort, TransitionResult
from statemachine.session_facts import session_facts
from statemachine.session_ops import end_all_sessions
from statemachine.state import FlowState, FlowStatus
from statemachine.transitions.committing import clean, record_and_send
from statemachine.transitions.external_operations import keep_uncaught_failure

FLOW_KILLED_EXCEPTION = "flows.errors.FlowKilledException"
"""The error a killed flow's handle raises."""


def finish(state: FlowState, event: FlowFinished) -> TransitionResult:
    """``call()`` returned: end every session, store the result, remove the checkpoint."""
    state = end_all_sessions(state, None, status=FlowStatus.COMPLETED)
    flow_id, flow_class = state.flow_id, state.checkpoint.flow_class
    after_commit: list[Action] = []
    actions: list[Action] = [
        RemoveCheckpoint(flow_id),
        StoreFlowResult(
            flow_id, flow_class, event.result, event.at, session_facts(state.checkpoint.sessions)
        ),
    ]
    actions.extend(record_and_send(state, event.at, after_commit))
    return TransitionResult(clean(state), tuple(actions + after_commit), Abort("completed"))


def fail(state: FlowState, event: FlowFailed) -> TransitionResult:
    """``call()`` raised: tell the peers (a FlowException as itself), store the error.

    An external operation's failure that escapes ``call()`` keeps the flow in the hospital
    instead (:func:`~statemachine.transitions.external_operations.keep_uncaught_failure`).
    """
    kept = keep_uncaught_failure(state, event)
    if kept is not None:
        return kept
    told_peers = event.error
    if told_peers.kind is not ErrorKind.FLOW_EXCEPTION:
        told_peers = FlowError(ErrorKind.UNEXPECTED_END, "", "", told_peers.error_id)
    state = end_all_sessions(state, told_peers, status=FlowStatus.FAILED, error=event.error)
    flow_id, flow_class = state.flow_id, state.checkpoint.flow_class
    after_commit: list[Action] = []
    actions: list[Action] = [
        RemoveCheckpoint(flow_id),
        StoreFlowError(
            flow_id,
            flow_class,
            event.error,
            event.at,
            event.traceback,
            session_facts(state.checkpoint.sessions),
        ),
    ]
    actions.extend(record_and_send(state, event.at, after_commit))
    return TransitionResult(clean(state), tuple(actions + after_commit), Abort("failed"))


def kill(state: FlowState, event: KillFlow) -> TransitionResult:
    """End the flow as failed with ``FlowKilledException``; peers see an unexpected end."""
    error = event.error or FlowError(ErrorKind.INTERNAL, FLOW_KILLED_EXCEPTION, event.reason)
    return fail(state, FlowFailed(error, event.at))
