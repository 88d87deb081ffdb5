"""Table tests of the pure transition function: whole states asserted after each step."""

from __future__ import annotations

import attrs
import pytest

from statemachine import IllegalTransitionError, transition
from statemachine.actions import (
    AcknowledgeMessages,
    HandOffMessages,
    PersistCheckpoint,
    RecordInboundMessages,
    RemoveCheckpoint,
    ScheduleWakeUp,
    StoreFlowError,
    StoreFlowResult,
    WriteOutbox,
)
from statemachine.events import (
    DeliverSessionMessage,
    FlowFailed,
    FlowFinished,
    LoadFlow,
    RestoreFlow,
    StartFlow,
    StartInitiatedFlow,
    Suspend,
    WakeUp,
)
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import (
    CloseSessions,
    InitiateSession,
    Receive,
    RecordValue,
    Send,
    SessionPayload,
    Sleep,
)
from statemachine.result import Abort, ProcessEvents, Resume, Throw
from statemachine.session_messages import (
    ConfirmSession,
    ExistingSessionMessage,
    InboundRecord,
    InitialSessionMessage,
    SessionData,
    SessionEnd,
    SessionErrorBody,
)
from statemachine.state import (
    Checkpoint,
    FlowState,
    FlowStatus,
    JournalEntry,
    Pending,
    StartedLocally,
    Value,
)
from statemachine.transition import MAX_UNCOMMITTED_STEPS, TRANSITIONS

BOB = "O=Bob,L=New York,C=US"
ORIGIN = StartedLocally("app.PingFlow", b"\x92\x90\x80")
T0 = 1000.0


def started() -> FlowState:
    return transition(None, StartFlow("f1", ORIGIN, T0)).state


def suspend(state: FlowState, request: object, at: float = T0) -> object:
    return transition(state, Suspend(request, at))  # type: ignore[arg-type]


def with_session(state: FlowState) -> FlowState:
    return transition(state, Suspend(InitiateSession(BOB, "app.PingFlow", 1, "app"), T0)).state


def test_start_flow_persists_an_unstarted_checkpoint_and_starts_the_fiber() -> None:
    result = transition(None, StartFlow("f1", ORIGIN, T0))
    unstarted = Checkpoint("f1", ORIGIN, FlowStatus.UNSTARTED, T0, version=1)  # 1st commit
    assert result.actions == (PersistCheckpoint(unstarted, T0),)
    assert result.state == FlowState(attrs.evolve(unstarted, status=FlowStatus.RUNNABLE))
    assert result.continuation == Resume(None)


def test_every_commit_of_a_checkpoint_has_the_next_version() -> None:
    state = started()
    assert state.checkpoint.version == 1
    versions = []
    for _ in range(3):  # a flow that sleeps three times commits three more checkpoints
        result = transition(state, Suspend(Sleep(5.0), T0))
        (persisted,) = [a for a in result.actions if isinstance(a, PersistCheckpoint)]
        versions.append(persisted.checkpoint.version)
        assert result.state.checkpoint.version == persisted.checkpoint.version
        state = transition(result.state, WakeUp(T0 + 5)).state
    assert versions == [2, 3, 4]


def test_initiate_session_is_journaled_without_a_commit() -> None:
    result = transition(started(), Suspend(InitiateSession(BOB, "app.PingFlow", 1, "app"), T0))
    (session,) = result.state.checkpoint.sessions
    assert session.session_id == "f1.s0"
    assert session.peer_session_id == "f1.s0.r"
    assert not session.initial_sent
    assert result.actions == ()
    assert result.continuation == Resume("f1.s0")
    assert tuple(result.state.checkpoint.journal) == (
        JournalEntry(("InitiateSession", BOB, "app.PingFlow"), Value("f1.s0")),
    )
    assert result.state.uncommitted_steps == 1


def test_first_send_is_the_initial_message_with_the_payload() -> None:
    state = with_session(started())
    result = transition(state, Suspend(Send((SessionPayload("f1.s0", b"ping"),)), T0))
    (message,) = result.state.unsent_outbound
    assert message.message_id == "N-f1.s0-0"
    assert message.target == BOB
    assert message.message == InitialSessionMessage("f1.s0", "app.PingFlow", 1, "app", b"ping")
    assert result.actions == ()  # deferred until the flow blocks
    assert result.continuation == Resume(None)

    second = transition(result.state, Suspend(Send((SessionPayload("f1.s0", b"two"),)), T0))
    assert second.state.unsent_outbound[1].message == ExistingSessionMessage(
        "f1.s0.r", 1, SessionData(b"two")
    )
    assert second.state.unsent_outbound[1].message_id == "N-f1.s0-1"


def test_blocking_receive_commits_everything_since_the_last_commit() -> None:
    state = with_session(started())
    state = transition(state, Suspend(Send((SessionPayload("f1.s0", b"ping"),)), T0)).state
    result = transition(state, Suspend(Receive(("f1.s0",)), T0 + 1))
    assert result.state.status is FlowStatus.SUSPENDED
    assert result.state.checkpoint.pending == Pending(Receive(("f1.s0",)))
    outbound = tuple(state.unsent_outbound)
    assert result.actions == (
        PersistCheckpoint(result.state.checkpoint, T0 + 1),
        WriteOutbox(outbound, T0 + 1),
        HandOffMessages(outbound),
    )
    assert result.continuation == ProcessEvents()
    assert not result.state.is_dirty()


def suspended_on_receive() -> FlowState:
    state = with_session(started())
    state = transition(state, Suspend(Send((SessionPayload("f1.s0", b"ping"),)), T0)).state
    return transition(state, Suspend(Receive(("f1.s0",)), T0)).state


def deliver(sequence: int, body: object, message_id: str | None = None) -> DeliverSessionMessage:
    mid = message_id or f"N-f1.s0.r-{sequence}"
    return DeliverSessionMessage("f1.s0", mid, BOB, sequence, body, T0 + 2)  # type: ignore[arg-type]


def test_delivery_completes_a_pending_receive_in_sequence_order() -> None:
    state = suspended_on_receive()
    early = transition(state, deliver(1, SessionData(b"pong")))
    assert early.continuation == ProcessEvents()  # sequence 0 (the confirm) is still missing
    assert early.state.checkpoint.sessions[0].early[0].sequence == 1
    assert early.state.status is FlowStatus.SUSPENDED

    done = transition(early.state, deliver(0, ConfirmSession(1, "app")))
    session = done.state.checkpoint.sessions[0]
    assert session.confirmed and session.peer_app_name == "app"
    assert session.inbox == () and session.early == ()
    assert session.next_receive_sequence == 2
    assert done.continuation == Resume((b"pong",))
    assert done.state.status is FlowStatus.RUNNABLE
    assert done.state.checkpoint.pending is None
    assert [r.sequence for r in done.state.unrecorded_inbound] == [1, 0]


def test_duplicate_sequence_is_acknowledged_and_ignored() -> None:
    def confirmed() -> FlowState:
        return transition(suspended_on_receive(), deliver(0, ConfirmSession(1, "app"))).state

    again = transition(confirmed(), deliver(0, ConfirmSession(1, "app"), message_id="other-id"))
    assert again.state == confirmed()  # a copy built apart: the duplicate changed nothing
    assert again.actions == (AcknowledgeMessages(("other-id",)),)


def test_end_at_the_head_of_the_inbox_throws_unexpected_end() -> None:
    state = transition(suspended_on_receive(), deliver(0, ConfirmSession(1, "app"))).state
    result = transition(state, deliver(1, SessionEnd()))
    assert isinstance(result.continuation, Throw)
    assert result.continuation.error.kind is ErrorKind.UNEXPECTED_END
    assert BOB in result.continuation.error.message


def test_flow_exception_from_the_peer_is_thrown_with_its_message() -> None:
    error = FlowError(ErrorKind.FLOW_EXCEPTION, "app.Oops", "out of stock")
    state = transition(suspended_on_receive(), deliver(0, ConfirmSession(1, "app"))).state
    result = transition(state, deliver(1, SessionErrorBody(error)))
    assert result.continuation == Throw(error)


def test_finish_ends_open_sessions_removes_the_checkpoint_and_keeps_the_result() -> None:
    state = with_session(started())
    state = transition(state, Suspend(Send((SessionPayload("f1.s0", b"x"),)), T0)).state
    result = transition(state, FlowFinished(b"result", T0 + 3))
    assert tuple(result.state.unsent_outbound) == ()  # all in the actions now
    assert result.state.status is FlowStatus.COMPLETED
    write = next(a for a in result.actions if isinstance(a, WriteOutbox))
    assert [m.message for m in write.messages][1] == ExistingSessionMessage(
        "f1.s0.r", 1, SessionEnd()
    )
    assert result.actions[:2] == (
        RemoveCheckpoint("f1"),
        StoreFlowResult("f1", "app.PingFlow", b"result", T0 + 3),
    )
    assert result.continuation == Abort("completed")


def test_internal_failure_tells_peers_nothing_but_keeps_the_detail_locally() -> None:
    state = suspended_on_receive()
    state = transition(state, deliver(0, ConfirmSession(1, "app"))).state
    state = transition(state, deliver(1, SessionData(b"pong"))).state
    assert state.status is FlowStatus.RUNNABLE
    detail = FlowError(ErrorKind.INTERNAL, "builtins.KeyError", "'secret'")
    result = transition(state, FlowFailed(detail, T0 + 4))
    write = next(a for a in result.actions if isinstance(a, WriteOutbox))
    (message,) = write.messages
    assert isinstance(message.message, ExistingSessionMessage)
    body = message.message.body
    assert isinstance(body, SessionErrorBody)
    assert body.error.kind is ErrorKind.UNEXPECTED_END and body.error.message == ""
    assert StoreFlowError("f1", "app.PingFlow", detail, T0 + 4) in result.actions
    assert RecordInboundMessages(tuple(state.unrecorded_inbound), T0 + 4) in result.actions


def test_sleep_blocks_with_a_durable_deadline_and_wakes_only_when_due() -> None:
    result = transition(started(), Suspend(Sleep(30), T0))
    assert result.state.checkpoint.pending == Pending(Sleep(30), T0 + 30)
    assert result.actions[-1] == ScheduleWakeUp("f1", T0 + 30)
    early = transition(result.state, WakeUp(T0 + 29))
    assert early.state == result.state and early.continuation == ProcessEvents()
    due = transition(result.state, WakeUp(T0 + 30))
    assert due.continuation == Resume(None)
    assert due.state.status is FlowStatus.RUNNABLE


def test_responder_start_confirms_and_buffers_the_first_payload() -> None:
    initial = InitialSessionMessage("f0.s3", "app.PingFlow", 2, "app", b"ping")
    event = StartInitiatedFlow("r1", "app.PongFlow", "N-f0.s3-0", BOB, initial, 1, "app", T0)
    result = transition(None, event)
    (session,) = result.state.checkpoint.sessions
    assert session.session_id == "f0.s3.r" and session.peer_session_id == "f0.s3"
    assert session.inbox == (SessionData(b"ping"),)
    assert session.peer_flow_version == 2
    (confirm,) = result.state.unsent_outbound
    assert confirm.message == ExistingSessionMessage("f0.s3", 0, ConfirmSession(1, "app"))
    assert confirm.message_id == "N-f0.s3.r-0"
    assert tuple(result.state.unrecorded_inbound) == (
        InboundRecord("N-f0.s3-0", BOB, "f0.s3.r", 0),
    )
    assert result.continuation == Resume(None)


def test_replay_answers_from_the_journal_and_detects_divergence() -> None:
    live = transition(started(), Suspend(RecordValue("uuid", "u-1"), T0)).state
    live = transition(live, Suspend(Sleep(10), T0)).state
    restored = transition(None, RestoreFlow(live.checkpoint, T0 + 1))
    assert restored.state.status is FlowStatus.REPLAYING
    assert restored.continuation == Resume(None)

    same = transition(restored.state, Suspend(RecordValue("uuid", "u-2"), T0 + 1))
    assert same.continuation == Resume("u-1")  # the journaled value, not the new candidate
    assert same.actions == ()

    resumed_sleep = transition(same.state, Suspend(Sleep(10), T0 + 1))
    assert resumed_sleep.state.checkpoint.pending == Pending(Sleep(10), T0 + 10)  # kept
    assert resumed_sleep.state.status is FlowStatus.SUSPENDED

    other = transition(restored.state, Suspend(RecordValue("random", 0.5), T0 + 1))
    assert other.state.status is FlowStatus.HOSPITALIZED
    assert isinstance(other.continuation, Abort)
    assert "step 1" in other.continuation.reason
    assert other.state.checkpoint.journal == live.checkpoint.journal


def test_long_non_blocking_runs_commit_periodically() -> None:
    state = started()
    commits = 0
    for index in range(MAX_UNCOMMITTED_STEPS * 2):
        result = transition(state, Suspend(RecordValue("uuid", str(index)), T0))
        state = result.state
        commits += any(isinstance(a, PersistCheckpoint) for a in result.actions)
    assert commits == 2


def test_close_sends_end_and_refuses_later_use() -> None:
    state = with_session(started())
    state = transition(state, Suspend(Send((SessionPayload("f1.s0", b"x"),)), T0)).state
    closed = transition(state, Suspend(CloseSessions(("f1.s0",)), T0))
    assert closed.state.unsent_outbound[-1].message == ExistingSessionMessage(
        "f1.s0.r", 1, SessionEnd()
    )
    refused = transition(closed.state, Suspend(Send((SessionPayload("f1.s0", b"y"),)), T0))
    assert isinstance(refused.continuation, Throw)
    assert "closed" in refused.continuation.error.message


@pytest.mark.parametrize(
    ("status", "event"),
    [
        (FlowStatus.SUSPENDED, Suspend(Sleep(1), T0)),
        (FlowStatus.HOSPITALIZED, Suspend(Sleep(1), T0)),
        (FlowStatus.SUSPENDED, FlowFinished(b"", T0)),
        (FlowStatus.COMPLETED, Suspend(Sleep(1), T0)),
        (FlowStatus.UNSTARTED, WakeUp(T0)),
    ],
)
def test_illegal_transition_names_flow_status_and_event_and_changes_nothing(
    status: FlowStatus, event: object
) -> None:
    def at_status() -> FlowState:
        state = started()
        return attrs.evolve(state, checkpoint=attrs.evolve(state.checkpoint, status=status))

    state = at_status()
    with pytest.raises(IllegalTransitionError) as caught:
        transition(state, event)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "f1" in message and status.value in message and type(event).__name__ in message
    assert state == at_status()  # a copy built apart: the refused event changed nothing


def test_creating_events_only_apply_to_a_new_flow() -> None:
    with pytest.raises(IllegalTransitionError, match="NEW"):
        transition(None, WakeUp(T0))
    for (status, event_type), _ in TRANSITIONS.items():
        if status is None:
            assert event_type in (StartFlow, StartInitiatedFlow, RestoreFlow, LoadFlow)
