"""Table tests of the status changes around the hospital and the end of a flow.

Every change of a flow's status is a row of ``TRANSITIONS``: keeping a flow (Hospitalize),
taking it out again (RetryFlow), killing it from every status where it is alive, and loading
what the store found at start (LoadFlow: restored, kept, or an untrusted placeholder). Each
rule is checked on values built independently here, not on the rule's own output.
"""

from __future__ import annotations

import attrs
import pytest

from statemachine import transition
from statemachine.actions import (
    PersistCheckpoint,
    RecordStatus,
    RemoveCheckpoint,
    StoreFlowError,
)
from statemachine.events import (
    Hospitalize,
    KillFlow,
    LoadFlow,
    RestoreFlow,
    RetryFlow,
    StartFlow,
    Suspend,
)
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import RecordValue, Sleep
from statemachine.result import Abort, ProcessEvents, Resume
from statemachine.state import (
    Checkpoint,
    FlowState,
    FlowStatus,
    JournalEntry,
    Pending,
    StartedLocally,
    StoredFlow,
    Value,
)
from statemachine.transition import FLOW_KILLED_EXCEPTION, TRANSITIONS, UNTRUSTED_CHECKPOINT

ORIGIN = StartedLocally("app.SleepyFlow", b"\x92\x90\x80")
T0 = 1000.0
KEPT = FlowError(ErrorKind.INTERNAL, "flows.errors.FlowFailedError", "kept by an operator")


def sleeping() -> FlowState:
    """A flow suspended on a sleep (its checkpoint committed: nothing unrecorded)."""
    started = transition(None, StartFlow("f1", ORIGIN, T0)).state
    return transition(started, Suspend(Sleep(60.0), T0)).state


def test_keeping_a_suspended_flow_records_only_its_row() -> None:
    state = sleeping()
    assert not state.is_dirty()
    result = transition(state, Hospitalize(KEPT, T0 + 1))
    assert result.state.status is FlowStatus.HOSPITALIZED
    assert result.state.checkpoint.error == KEPT
    assert result.actions == (RecordStatus("f1", FlowStatus.HOSPITALIZED, "kept by an operator"),)
    assert result.continuation == Abort("kept by an operator")
    # Nothing else of the checkpoint changed: it is kept as it was committed.
    assert attrs.evolve(result.state.checkpoint, status=FlowStatus.SUSPENDED, error=None) == (
        state.checkpoint
    )


def test_keeping_a_flow_with_uncommitted_steps_commits_them_with_it() -> None:
    started = transition(None, StartFlow("f1", ORIGIN, T0)).state
    running = transition(started, Suspend(RecordValue("now", 1.5), T0)).state
    assert running.is_dirty() and running.checkpoint.version == 1
    result = transition(running, Hospitalize(KEPT, T0))
    (persisted,) = [a for a in result.actions if isinstance(a, PersistCheckpoint)]
    assert persisted.checkpoint.status is FlowStatus.HOSPITALIZED
    assert persisted.checkpoint.version == 2
    assert tuple(persisted.checkpoint.journal) == (
        JournalEntry(("RecordValue", "now"), Value(1.5)),
    )
    assert not result.state.is_dirty()


@pytest.mark.parametrize(
    "status",
    [FlowStatus.RUNNABLE, FlowStatus.SUSPENDED, FlowStatus.REPLAYING, FlowStatus.HOSPITALIZED],
)
def test_every_live_status_can_be_kept_and_killed(status: FlowStatus) -> None:
    assert (status, Hospitalize) in TRANSITIONS
    assert (status, KillFlow) in TRANSITIONS
    state = FlowState(Checkpoint("f1", ORIGIN, status, T0, version=3))
    killed = transition(state, KillFlow("stuck", T0))
    assert killed.state.status is FlowStatus.FAILED
    error = FlowError(ErrorKind.INTERNAL, FLOW_KILLED_EXCEPTION, "stuck")
    assert killed.actions[:2] == (
        RemoveCheckpoint("f1"),
        StoreFlowError("f1", ORIGIN.flow_class, error, T0),
    )
    assert isinstance(killed.continuation, Abort)


def test_retry_replays_a_kept_flow_from_its_stored_checkpoint() -> None:
    stored = attrs.evolve(sleeping().checkpoint, status=FlowStatus.HOSPITALIZED, error=KEPT)
    kept = transition(None, RestoreFlow(stored, T0)).state
    assert kept.status is FlowStatus.HOSPITALIZED
    result = transition(kept, RetryFlow(stored, T0 + 5))
    assert result.state.status is FlowStatus.REPLAYING
    assert result.state.checkpoint.error is None
    assert result.state.checkpoint.pending == Pending(Sleep(60.0), T0 + 60.0)
    assert result.actions == (RecordStatus("f1", FlowStatus.SUSPENDED, None),)
    assert result.continuation == Resume(None)


def test_retry_of_a_flow_kept_before_it_ran_starts_it_afresh() -> None:
    unstarted = Checkpoint("f2", ORIGIN, FlowStatus.HOSPITALIZED, T0, error=KEPT, version=1)
    kept = transition(None, RestoreFlow(unstarted, T0)).state
    result = transition(kept, RetryFlow(unstarted, T0))
    assert result.state.status is FlowStatus.RUNNABLE
    assert result.actions == (RecordStatus("f2", FlowStatus.UNSTARTED, None),)
    assert result.continuation == Resume(None)


def test_a_kept_flow_is_restored_kept() -> None:
    stored = attrs.evolve(sleeping().checkpoint, status=FlowStatus.HOSPITALIZED, error=KEPT)
    result = transition(None, RestoreFlow(stored, T0))
    assert result.state.status is FlowStatus.HOSPITALIZED
    assert result.actions == () and result.continuation == ProcessEvents()


def test_retry_is_only_for_kept_flows() -> None:
    assert [status for (status, event) in TRANSITIONS if event is RetryFlow] == [
        FlowStatus.HOSPITALIZED
    ]


# --- loading what the store found -----------------------------------------------------------

BAD_MAC = "its MAC does not match (changed, or another flow's)"


def untrusted(row_status: FlowStatus, row_reason: str | None) -> StoredFlow:
    """What the store reports for a flow whose checkpoint it could not trust."""
    return StoredFlow("f9", "app.SleepyFlow", T0, row_status, row_reason, None, BAD_MAC)


def test_an_untrusted_checkpoint_loads_as_a_kept_placeholder_and_its_row_says_why() -> None:
    result = transition(None, LoadFlow(untrusted(FlowStatus.SUSPENDED, None), T0 + 1))
    expected = Checkpoint(
        "f9",
        StartedLocally("app.SleepyFlow", b""),
        FlowStatus.HOSPITALIZED,
        T0,
        error=FlowError(ErrorKind.INTERNAL, UNTRUSTED_CHECKPOINT, BAD_MAC),
    )
    assert result.state == FlowState(expected)
    assert result.actions == (RecordStatus("f9", FlowStatus.HOSPITALIZED, BAD_MAC),)
    assert result.continuation == ProcessEvents()  # never run


def test_an_untrusted_checkpoint_whose_row_already_says_so_writes_nothing() -> None:
    result = transition(None, LoadFlow(untrusted(FlowStatus.HOSPITALIZED, BAD_MAC), T0 + 1))
    assert result.state.status is FlowStatus.HOSPITALIZED
    assert result.actions == ()


def test_a_trusted_checkpoint_loads_to_replay_and_writes_nothing() -> None:
    stored = sleeping().checkpoint
    result = transition(None, LoadFlow(StoredFlow.trusted(stored), T0 + 1))
    assert result.state.status is FlowStatus.REPLAYING
    assert result.state.replay_cursor == 0
    assert result.actions == ()
    assert result.continuation == Resume(None)


def test_a_flow_whose_row_says_kept_loads_kept_with_the_row_s_reason() -> None:
    stored = sleeping().checkpoint  # its blob still says SUSPENDED
    facts = attrs.evolve(
        StoredFlow.trusted(stored, "kept by an operator"), row_status=FlowStatus.HOSPITALIZED
    )
    result = transition(None, LoadFlow(facts, T0 + 1))
    assert result.state.status is FlowStatus.HOSPITALIZED
    assert result.state.checkpoint.error == KEPT
    assert result.actions == () and result.continuation == ProcessEvents()
