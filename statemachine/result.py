"""The output of one transition: the new state, the actions, and what the fiber does next."""

from __future__ import annotations

from typing import Union

import attrs

from statemachine.actions import Action
from statemachine.flow_error import FlowError
from statemachine.iorequests import Plain
from statemachine.state import FlowState, Outcome, Raised


@attrs.frozen
class Resume:
    """Resume the fiber with ``value`` (or start it, if it has not run yet)."""

    value: Plain


@attrs.frozen
class Throw:
    """Resume the fiber by raising ``error`` at its suspension point."""

    error: FlowError


@attrs.frozen
class ProcessEvents:
    """Leave the fiber where it is and wait for further events."""


@attrs.frozen
class Abort:
    """Discard the fiber: the flow finished, failed or was hospitalized."""

    reason: str


@attrs.frozen
class StartAgain:
    """Discard the fiber and run the flow's ``call()`` again, from its (new) origin."""


Continuation = Union[Resume, Throw, ProcessEvents, Abort, StartAgain]
"""What happens to the flow's fiber once the actions are done."""


def continuation_for(outcome: Outcome) -> Resume | Throw:
    """The continuation that hands a completed request's outcome to the fiber."""
    if isinstance(outcome, Raised):
        return Throw(outcome.error)
    return Resume(outcome.value)


@attrs.frozen
class TransitionResult:
    """``transition(state, event)`` returns one of these; it never mutates its input."""

    state: FlowState
    actions: tuple[Action, ...]
    continuation: Continuation
