"""Rules for a flow's external operations: start an attempt, take its end, retry, time out.

A flow that calls ``FlowLogic.call_external`` suspends on a :class:`RunOperation`. Each
attempt starts the same way: the flow *commits* (its checkpoint names the operation and the
attempt) and only then is the node asked to run it (:class:`StartOperation`, after the
commit). So a node that dies before that commit started nothing, and one that dies after it
runs the attempt again when the flow is replayed, with the same idempotency key
(:func:`idempotency_key`): an operation runs *at least once* per step, and the key lets the
service it calls make that exactly once.

The result is journaled like any request's, and so committed with the flow's next
checkpoint; a failure the policy retries waits (durably: the attempt number and the time
are in the checkpoint) and tries again; the last failure, or one the policy does not retry,
reaches the flow as an exception it can catch. An attempt that outlives the operation's
timeout is abandoned and counts as a retried failure. If the exception escapes ``call()``
the flow is kept in the hospital with the operation pending again, so that an operator's
retry (once the outside world is fixed) runs it afresh.

Everything here is pure: the jitter of a backoff is drawn from a hash of the flow, the
operation and the attempt, so a replay decides exactly as the first run did.
"""

from __future__ import annotations

import hashlib

from statemachine.actions import StartOperation
from statemachine.events import FlowFailed, OperationEnded, WakeUp
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.immutable import replace
from statemachine.iorequests import RunOperation
from statemachine.result import Abort, ProcessEvents, TransitionResult
from statemachine.state import FlowState, FlowStatus, Pending, Raised, StartedLocally
from statemachine.transitions.committing import block, commit, complete

OPERATION_FAILED_EXCEPTION = "flows.errors.OperationFailedException"
"""What a flow sees when its external operation failed for good."""
OPERATION_TIMEOUT_EXCEPTION = "flows.errors.OperationTimeoutException"
"""What a flow sees when the last attempt of its external operation outlived its timeout."""
OPERATION_FAILURES = (OPERATION_FAILED_EXCEPTION, OPERATION_TIMEOUT_EXCEPTION)


def idempotency_key(flow_id: str, ordinal: int, generation: int = 0) -> str:
    """The key of the flow's ``ordinal``-th operation: the same on every attempt and re-run.

    ``generation`` counts the flow's runs as new (``continue_as_new``): each run numbers its
    operations from 0, so later runs' keys carry their generation.
    """
    if generation:
        return f"{flow_id}.{generation}:op:{ordinal}"
    return f"{flow_id}:op:{ordinal}"


def run_operation(state: FlowState, request: RunOperation, at: float) -> TransitionResult:
    """A live flow asks for an external operation: commit, then start its first attempt."""
    return _start(state, replace(request, attempt=1, backing_off=False), at)


def resume_operation(
    state: FlowState, asked: RunOperation, pending: Pending, at: float
) -> TransitionResult:
    """A replayed flow reached the operation it waited for (``pending``): wait, or run it again.

    The timeout and the policy are the ones the flow asks with now (``asked``); how far the
    tries had got is the checkpoint's. An attempt that was running when the node stopped is
    run again (same attempt number, same key); a wait between attempts keeps its durable
    deadline.
    """
    progress = pending.request
    assert isinstance(progress, RunOperation)
    request = replace(asked, attempt=progress.attempt, backing_off=progress.backing_off)
    if request.backing_off:
        return block(state, Pending(request, pending.deadline), at)
    return _start(state, request, at)


def operation_ended(state: FlowState, event: OperationEnded) -> TransitionResult:
    """An attempt ended: resume the flow with the result, retry, or raise the failure.

    An end that is not the running attempt's (it timed out, or the flow moved on) is ignored.
    """
    pending = state.checkpoint.pending
    request = None if pending is None else pending.request
    if (
        not isinstance(request, RunOperation)
        or request.backing_off
        or request.ordinal != event.ordinal
        or request.attempt != event.attempt
    ):
        return TransitionResult(state, (), ProcessEvents())
    outcome = event.outcome
    if isinstance(outcome, Raised):
        return _failed(state, request, outcome.error, event.retryable, event.at)
    return complete(state, request, outcome, event.at)


def operation_wake_up(state: FlowState, request: RunOperation, event: WakeUp) -> TransitionResult:
    """The deadline passed: a wait before an attempt is over, or an attempt timed out."""
    if request.backing_off:
        return _start(state, replace(request, backing_off=False), event.at)
    error = FlowError(
        ErrorKind.FLOW_EXCEPTION,
        OPERATION_TIMEOUT_EXCEPTION,
        f"{request.describe()} did not finish within {request.timeout:g} s",
    )
    return _failed(state, request, error, True, event.at)


def keep_uncaught_failure(state: FlowState, event: FlowFailed) -> TransitionResult | None:
    """If ``call()`` let its operation's failure escape, keep the flow with it pending again.

    Applies when the last journal entry is that operation, failed with the very error the
    flow ended with (nothing ran in between). The flow is kept in the hospital; its
    checkpoint waits on the operation at its first attempt, so a retry runs it afresh.
    Otherwise returns None (the flow fails as any other).
    """
    error = event.error
    journal = state.checkpoint.journal
    if error.exception_class not in OPERATION_FAILURES or not journal:
        return None
    last = journal[-1]
    if last.signature[0] != "RunOperation" or not isinstance(last.outcome, Raised):
        return None
    journaled = last.outcome.error
    if (journaled.exception_class, journaled.message) != (error.exception_class, error.message):
        return None
    _, label, ordinal, name = last.signature
    assert isinstance(label, str) and isinstance(ordinal, int) and isinstance(name, str)
    # The timeout and policy are the flow's own when its replay asks again.
    request = RunOperation(label, ordinal, name)
    kept = FlowError(ErrorKind.INTERNAL, error.exception_class, error.message, error.error_id)
    state, actions = commit(
        state,
        event.at,
        {
            "journal": journal.delete(len(journal) - 1),
            "status": FlowStatus.HOSPITALIZED,
            "pending": Pending(request, None),
            "error": kept,
        },
        replay_cursor=len(journal) - 1,
    )
    return TransitionResult(state, actions, Abort(kept.message))


def _start(state: FlowState, request: RunOperation, at: float) -> TransitionResult:
    deadline = None if request.timeout is None else at + request.timeout
    result = block(state, Pending(request, deadline), at)
    origin = state.checkpoint.origin
    generation = origin.generation if isinstance(origin, StartedLocally) else 0
    key = idempotency_key(state.flow_id, request.ordinal, generation)
    start = StartOperation(state.flow_id, request.ordinal, request.attempt, key)
    return TransitionResult(result.state, (*result.actions, start), result.continuation)


def _failed(
    state: FlowState, request: RunOperation, error: FlowError, retryable: bool, at: float
) -> TransitionResult:
    policy = request.policy
    if retryable and request.attempt < policy.attempts:
        delay = policy.delay(request.attempt, _spread(state.flow_id, request))
        waiting = replace(request, attempt=request.attempt + 1, backing_off=True)
        return block(state, Pending(waiting, at + delay), at)
    tries = f"attempt {request.attempt} of {policy.attempts}"
    error = replace(error, message=f"{error.message} ({tries})")
    return complete(state, request, Raised(error), at)


def _spread(flow_id: str, request: RunOperation) -> float:
    """A number in [0, 1) fixed by the flow, the operation and the attempt: the jitter."""
    seed = f"{flow_id}:{request.ordinal}:{request.attempt}".encode()
    return int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big") / 2**64
