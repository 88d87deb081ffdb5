"""The transition function: ``transition(state, event) -> TransitionResult``.

Everything that decides what a flow does lives in the rules of
:mod:`statemachine.transitions` (by concern: starting, requests, replay, delivery, hospital,
ending) and in :mod:`statemachine.session_ops`; this module puts the rules in one table.

* Every rule is pure. It reads its arguments, builds new frozen values and returns them. No
  I/O, no clock, no randomness: the time comes in on the event, random values come in as
  candidates.
* Every change of a flow's status is a row of ``TRANSITIONS``, keyed by ``(status, event
  type)``; a status of ``None`` is a flow that does not exist yet. A pair missing from the
  table raises :class:`IllegalTransitionError` naming the flow, its status and the event.
* Requests of a live flow are dispatched by a table too
  (:data:`statemachine.transitions.requests.REQUESTS`).
* A restored flow is REPLAYING: each request is answered from the journal and must match the
  journal's signature; a mismatch sends the flow to the hospital (kept, never lost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from statemachine.errors import IllegalTransitionError
from statemachine.events import (
    DeliverSessionMessage,
    Event,
    FlowFailed,
    FlowFinished,
    Hibernate,
    Hospitalize,
    KillFlow,
    LoadFlow,
    OperationEnded,
    RestoreFlow,
    RetryFlow,
    StartFlow,
    StartInitiatedFlow,
    Suspend,
    WakeUp,
)
from statemachine.result import TransitionResult
from statemachine.state import FlowState, FlowStatus
from statemachine.transitions.committing import (
    COMMIT_GROWTH_DIVISOR,
    MAX_UNCOMMITTED_STEPS,
    commit_before_hibernation,
    commit_due,
)
from statemachine.transitions.delivery import (
    FLOW_TIMEOUT_EXCEPTION,
    deliver,
    drop_late_message,
    ignore,
    wake_up,
)
from statemachine.transitions.ending import FLOW_KILLED_EXCEPTION, fail, finish, kill
from statemachine.transitions.external_operations import operation_ended
from statemachine.transitions.hospital import hospitalize, retry
from statemachine.transitions.replay import finish_replaying, suspend_replaying
from statemachine.transitions.requests import suspend_live
from statemachine.transitions.starting import (
    KEPT_IN_HOSPITAL,
    UNTRUSTED_CHECKPOINT,
    load_flow,
    reject_initial_session,
    restore_flow,
    start_flow,
    start_initiated_flow,
)

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
    if isinstance(event, LoadFlow):
        return event.stored.flow_id
    return str(getattr(event, "flow_id", "?"))


_S = FlowStatus
_LIVE = (_S.RUNNABLE, _S.SUSPENDED, _S.REPLAYING)
_ENDED = (_S.COMPLETED, _S.FAILED)

TRANSITIONS: dict[tuple[FlowStatus | None, type], Handler] = {
    # starting (statemachine.transitions.starting)
    (None, StartFlow): start_flow,
    (None, StartInitiatedFlow): start_initiated_flow,
    (None, RestoreFlow): restore_flow,
    (None, LoadFlow): load_flow,
    # requests and replay
    (_S.RUNNABLE, Suspend): suspend_live,
    (_S.REPLAYING, Suspend): suspend_replaying,
    # delivery
    **{(status, DeliverSessionMessage): deliver for status in (*_LIVE, _S.HOSPITALIZED)},
    (_S.SUSPENDED, WakeUp): wake_up,
    (_S.SUSPENDED, Hibernate): commit_before_hibernation,
    **{(status, WakeUp): ignore for status in (_S.RUNNABLE, _S.REPLAYING, _S.HOSPITALIZED)},
    **{(status, WakeUp): ignore for status in _ENDED},
    **{(status, DeliverSessionMessage): drop_late_message for status in _ENDED},
    # external operations (statemachine.transitions.external_operations)
    (_S.SUSPENDED, OperationEnded): operation_ended,
    **{
        (status, OperationEnded): ignore
        for status in (_S.RUNNABLE, _S.REPLAYING, _S.HOSPITALIZED, *_ENDED)
    },
    # the hospital
    **{(status, Hospitalize): hospitalize for status in (*_LIVE, _S.HOSPITALIZED)},
    (_S.HOSPITALIZED, RetryFlow): retry,
    # ending
    (_S.RUNNABLE, FlowFinished): finish,
    (_S.RUNNABLE, FlowFailed): fail,
    (_S.REPLAYING, FlowFinished): finish_replaying,
    (_S.REPLAYING, FlowFailed): finish_replaying,
    **{(status, KillFlow): kill for status in (*_LIVE, _S.HOSPITALIZED)},
    **{(status, KillFlow): ignore for status in _ENDED},
}
"""Every legal (status, event kind) pair and the rule that handles it."""

__all__ = [
    "COMMIT_GROWTH_DIVISOR",
    "FLOW_KILLED_EXCEPTION",
    "FLOW_TIMEOUT_EXCEPTION",
    "KEPT_IN_HOSPITAL",
    "UNTRUSTED_CHECKPOINT",
    "MAX_UNCOMMITTED_STEPS",
    "TRANSITIONS",
    "commit_due",
    "reject_initial_session",
    "transition",
]
