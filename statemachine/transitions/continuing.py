"""The rule for a flow that continues as new (``FlowLogic.continue_as_new``).

A flow that loops for ever (a poller, a periodic job) would otherwise journal every step of
every loop: its checkpoint, rewritten at each commit, and its replay after a restart or a
hibernation would grow without bound. Continuing as new ends the current run of ``call()``
and starts a new one with the arguments the flow gives: the journal starts empty, the flow
keeps its id. In the same commit, every session the flow still talks on is ended as finishing
would end it (the peer sees the end), and sessions over at both ends are dropped from the
checkpoint. Only a flow started on this node (by code, a client or a schedule) can continue
as new: a responder's run is tied to the session that started it.
"""

from __future__ import annotations

from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import ContinueAsNew
from statemachine.result import StartAgain, TransitionResult
from statemachine.session_ops import end_all_sessions
from statemachine.state import FlowState, FlowStatus, Raised, StartedLocally
from statemachine.transitions.committing import commit, complete

NOT_STARTED_LOCALLY = "flows.errors.FlowDefinitionError"
"""What a responder that asks to continue as new gets (it cannot)."""


def continue_as_new(state: FlowState, request: ContinueAsNew, at: float) -> TransitionResult:
    """Commit the flow as new (empty journal, new arguments) and run ``call()`` again."""
    origin = state.checkpoint.origin
    if not isinstance(origin, StartedLocally):
        error = FlowError(
            ErrorKind.INTERNAL,
            NOT_STARTED_LOCALLY,
            f"{origin.flow_class} cannot continue as new: it is a responder, started by "
            f"{origin.counterparty}'s session (only flows started on their node can)",
        )
        return complete(state, request, Raised(error), at)
    state = end_all_sessions(state, None)
    kept = [
        session
        for session in state.checkpoint.sessions
        if session.initial_sent and not (session.closed_by_us and session.peer_finished())
    ]
    again = StartedLocally(origin.flow_class, request.arguments, origin.generation + 1)
    state, actions = commit(
        state,
        at,
        {
            "origin": again,
            "status": FlowStatus.RUNNABLE,
            "journal": (),
            "sessions": kept,
            "pending": None,
            "progress_step": None,
        },
        replay_cursor=0,
        receive_progress=None,
    )
    return TransitionResult(state, actions, StartAgain())
