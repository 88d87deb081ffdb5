"""Rules that keep a flow for observation, and take it out again.

A flow is kept (HOSPITALIZED) when replay finds it non-deterministic
(:mod:`~statemachine.transitions.replay`), when its checkpoint cannot be trusted or
restored (:mod:`~statemachine.transitions.starting`), and on :class:`Hospitalize`: the node
found its checkpoint incompatible with the installed code, its hospital gave up after
repeated failures, or an operator asked. A kept flow does not run; messages for it are still
taken in. :class:`RetryFlow` (an operator, after a fix) replays it from its stored checkpoint.
"""

from __future__ import annotations

from statemachine.actions import RecordStatus
from statemachine.events import Hospitalize, RestoreFlow, RetryFlow
from statemachine.immutable import replace
from statemachine.result import Abort, TransitionResult
from statemachine.state import FlowState, FlowStatus
from statemachine.transitions.committing import commit, with_status
from statemachine.transitions.starting import restore_flow


def hospitalize(state: FlowState, event: Hospitalize) -> TransitionResult:
    """Keep the flow: it stops running; its row says HOSPITALIZED with the reason.

    What it did since its last commit (messages taken in, effects asked for) is committed
    with it, so nothing taken in is left unsettled; otherwise only its row changes and its
    stored checkpoint stays as it was.
    """
    state = with_status(state, FlowStatus.HOSPITALIZED, error=event.error)
    if state.is_dirty():
        state, actions = commit(state, event.at)
    else:
        actions = (RecordStatus(state.flow_id, FlowStatus.HOSPITALIZED, event.error.message),)
    return TransitionResult(state, actions, Abort(event.error.message))


def retry(_: FlowState, event: RetryFlow) -> TransitionResult:
    """Replay a kept flow from its stored checkpoint.

    The checkpoint is read again (the code, or the blob, may have been fixed since); the
    flow's row shows the status it resumes with.
    """
    checkpoint = event.checkpoint
    if checkpoint.status is FlowStatus.HOSPITALIZED:
        status = FlowStatus.SUSPENDED if checkpoint.pending else FlowStatus.RUNNABLE
        if not checkpoint.journal and checkpoint.pending is None:
            status = FlowStatus.UNSTARTED
        checkpoint = replace(checkpoint, status=status, error=None)
    result = restore_flow(None, RestoreFlow(checkpoint, event.at))
    record = RecordStatus(checkpoint.flow_id, checkpoint.status, None)
    return TransitionResult(result.state, (record,), result.continuation)
