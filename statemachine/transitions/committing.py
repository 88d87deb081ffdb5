"""What the rules share: journal a request, resume or block the flow, commit.

A live flow commits (checkpoint, dedup ids, outbox, effects) only when it blocks, finishes,
fails, or has done enough requests since its last commit (:func:`commit_due`: at least
``MAX_UNCOMMITTED_STEPS``, and at least a ``1 / COMMIT_GROWTH_DIVISOR`` share of its
checkpoint's entries, so a flow that grows without blocking encodes O(final size) bytes in
all, not O(size) every 32 steps). Between commits it runs on without touching the database:
nothing it did is visible outside until the commit, so a crash replays it from the last
checkpoint.
"""

from __future__ import annotations

from typing import Any

from statemachine.actions import (
    AcknowledgeMessages,
    Action,
    HandOffMessages,
    PersistCheckpoint,
    RecordInboundMessages,
    RunFlowEffects,
    ScheduleWakeUp,
    WriteOutbox,
)
from statemachine.events import Hibernate
from statemachine.immutable import EMPTY_VECTOR, replace
from statemachine.iorequests import IORequest, Receive
from statemachine.result import ProcessEvents, TransitionResult, continuation_for
from statemachine.session_ops import receive_progress
from statemachine.state import FlowState, FlowStatus, JournalEntry, Outcome, Pending

MAX_UNCOMMITTED_STEPS = 32
"""A live flow that keeps running without blocking commits after at least this many requests."""

COMMIT_GROWTH_DIVISOR = 4
"""...and after at least its checkpoint's entries (journal entries plus sessions) divided by
this: each commit then comes once the checkpoint has grown by a third since the previous one,
so the bytes encoded by all commits of a flow are a small multiple of its final checkpoint."""


def commit(
    state: FlowState,
    at: float,
    checkpoint_changes: dict[str, Any] | None = None,
    **state_changes: Any,
) -> tuple[FlowState, tuple[Action, ...]]:
    """Persist the checkpoint with everything since the last commit; clear the pending work.

    ``checkpoint_changes`` (checkpoint fields) and ``state_changes`` (``FlowState`` fields)
    are made in the same step, so the checkpoint and the state are each copied once. Each
    commit of a flow's checkpoint has the next version (bound into its MAC by the store, so
    an older checkpoint put back is told from the newest).
    """
    old = state.checkpoint
    checkpoint = replace(old, version=old.version + 1, **(checkpoint_changes or {}))
    in_transaction: list[Action] = [PersistCheckpoint(checkpoint, at)]
    after_commit: list[Action] = []
    in_transaction.extend(record_and_send(state, at, after_commit))
    state = replace(state, checkpoint=checkpoint, **_CLEAN, **state_changes)
    return state, tuple(in_transaction + after_commit)


_CLEAN: dict[str, Any] = {
    "unrecorded_inbound": EMPTY_VECTOR,
    "unsent_outbound": EMPTY_VECTOR,
    "unrun_effects": EMPTY_VECTOR,
    "uncommitted_steps": 0,
}
"""The ``FlowState`` fields a commit empties: what it wrote."""


def commit_due(state: FlowState) -> bool:
    """True if a live flow that has not blocked has run long enough to commit now."""
    checkpoint = state.checkpoint
    entries = len(checkpoint.journal) + len(checkpoint.sessions)
    due = max(MAX_UNCOMMITTED_STEPS, entries // COMMIT_GROWTH_DIVISOR)
    return state.uncommitted_steps >= due


def clean(state: FlowState, **changes: Any) -> FlowState:
    """``state`` once everything since the last commit is in the transaction's actions."""
    return replace(state, **_CLEAN, **changes)


def record_and_send(state: FlowState, at: float, after_commit: list[Action]) -> list[Action]:
    """The dedup-id and outbox actions (and their after-commit halves) for ``state``."""
    actions: list[Action] = []
    if state.unrecorded_inbound:
        records = tuple(state.unrecorded_inbound)
        actions.append(RecordInboundMessages(records, at))
        after_commit.append(AcknowledgeMessages(tuple(r.message_id for r in records)))
    if state.unsent_outbound:
        outbound = tuple(state.unsent_outbound)
        actions.append(WriteOutbox(outbound, at))
        after_commit.append(HandOffMessages(outbound))
    if state.unrun_effects:
        actions.append(RunFlowEffects(state.flow_id, tuple(state.unrun_effects)))
    return actions


def with_status(state: FlowState, status: FlowStatus, **changes: Any) -> FlowState:
    """``state`` with its checkpoint's status (and any other checkpoint field) changed."""
    return replace(state, checkpoint=replace(state.checkpoint, status=status, **changes))


def journal_request(
    state: FlowState, request: IORequest, outcome: Outcome, **checkpoint_changes: Any
) -> FlowState:
    """``state`` with ``request`` and its outcome added to the journal (one step more).

    ``checkpoint_changes`` are made to the checkpoint in the same copy.
    """
    entry = JournalEntry(request.signature(), outcome)
    old = state.checkpoint
    journal = old.journal.append(entry)
    checkpoint = replace(old, journal=journal, **checkpoint_changes)
    return replace(
        state,
        checkpoint=checkpoint,
        replay_cursor=len(journal),
        uncommitted_steps=state.uncommitted_steps + 1,
        receive_progress=None,
    )


def complete(state: FlowState, request: IORequest, outcome: Outcome, at: float) -> TransitionResult:
    """Journal a completed request and resume the fiber, committing only if overdue."""
    state = journal_request(state, request, outcome, status=FlowStatus.RUNNABLE, pending=None)
    actions: tuple[Action, ...] = ()
    if commit_due(state):
        state, actions = commit(state, at)
    return TransitionResult(state, actions, continuation_for(outcome))


def block(
    state: FlowState, pending: Pending, at: float, stored: Pending | None = None
) -> TransitionResult:
    """Suspend the flow on ``pending``: commit, and arrange a wake-up if it has a deadline.

    ``stored`` is what the flow's stored checkpoint says it waits for (a restored flow whose
    replay has reached it): if that is ``pending`` and nothing happened since the checkpoint,
    the stored checkpoint already is this state, so nothing is written.
    """
    progress = None
    if isinstance(pending.request, Receive):
        progress = receive_progress(state, pending.request)
    if stored is not None and stored == pending and not state.is_dirty():
        checkpoint = replace(state.checkpoint, status=FlowStatus.SUSPENDED, pending=pending)
        state = replace(state, checkpoint=checkpoint, receive_progress=progress)
        actions: tuple[Action, ...] = ()
        if pending.deadline is not None:
            actions = (ScheduleWakeUp(state.flow_id, pending.deadline),)
        return TransitionResult(state, actions, ProcessEvents())
    state, actions = commit(
        state,
        at,
        {"status": FlowStatus.SUSPENDED, "pending": pending},
        receive_progress=progress,
    )
    if pending.deadline is not None:
        actions = (*actions, ScheduleWakeUp(state.flow_id, pending.deadline))
    return TransitionResult(state, actions, ProcessEvents())


def commit_before_hibernation(state: FlowState, event: Hibernate) -> TransitionResult:
    """Commit what a waiting flow holds uncommitted, so its checkpoint is all of it."""
    if not state.is_dirty():
        return TransitionResult(state, (), ProcessEvents())
    state, actions = commit(state, event.at)
    return TransitionResult(state, actions, ProcessEvents())
