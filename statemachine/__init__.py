"""The sans-IO core of fiberflow: immutable flow state, events, actions and ``transition``.

This package imports only the standard library, attrs and pyrsistent (a test checks that
none of it loads I/O). The executor and scheduler that drive it
(:mod:`statemachine.executor`, :mod:`statemachine.manager`) talk to the database, the
transport and the fibers only through the protocols in :mod:`statemachine.ports`.
"""

from statemachine.errors import IllegalTransitionError, StateMachineError, UnknownSessionError
from statemachine.result import TransitionResult
from statemachine.state import Checkpoint, FlowState, FlowStatus
from statemachine.transition import TRANSITIONS, transition

__all__ = [
    "TRANSITIONS",
    "Checkpoint",
    "FlowState",
    "FlowStatus",
    "IllegalTransitionError",
    "StateMachineError",
    "TransitionResult",
    "UnknownSessionError",
    "transition",
]
