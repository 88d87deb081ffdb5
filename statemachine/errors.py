"""Errors raised by the state machine core itself (bugs and misuse, never flow errors).

Errors that happen *inside* a flow are data (:class:`statemachine.state.FlowError`), carried
in events, journals and session messages; the ``flows`` package turns them into exceptions.
"""

from __future__ import annotations


class StateMachineError(Exception):
    """Root of the errors raised by the state machine core."""


class IllegalTransitionError(StateMachineError):
    """An event arrived in a status for which no transition is defined.

    The message names the flow, its status and the event, so a log line is enough to find
    which rule is missing. The state given to ``transition`` is left unchanged.
    """

    def __init__(self, flow_id: str, status: str, event: object) -> None:
        self.flow_id = flow_id
        self.status = status
        self.event = event
        super().__init__(
            f"flow {flow_id}: no transition for event {type(event).__name__} "
            f"in status {status} ({event!r})"
        )


class UnknownSessionError(StateMachineError):
    """A request or event named a session the flow does not own."""

    def __init__(self, flow_id: str, session_id: str) -> None:
        self.flow_id = flow_id
        self.session_id = session_id
        super().__init__(f"flow {flow_id} has no session {session_id}")


class AfterCommitError(StateMachineError):
    """Something failed after a transaction committed (acknowledging, handing off, timers).

    What was committed stands; the node must not run the same actions again. Its cause is
    the original error.
    """
