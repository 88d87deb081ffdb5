"""Rules that create a flow: started here, started by a peer, restored from the store."""

from __future__ import annotations

from statemachine.actions import (
    AcknowledgeMessages,
    Action,
    HandOffMessages,
    PersistCheckpoint,
    RecordInboundMessages,
    RecordStatus,
    WriteOutbox,
)
from statemachine.errors import IllegalTransitionError
from statemachine.events import LoadFlow, RestoreFlow, StartFlow, StartInitiatedFlow
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.immutable import replace
from statemachine.result import ProcessEvents, Resume, TransitionResult
from statemachine.session_ids import message_id, responder_session_id
from statemachine.session_messages import (
    ExistingSessionMessage,
    InboundRecord,
    InitialSessionMessage,
    OutboundSessionMessage,
    SessionReject,
)
from statemachine.session_ops import confirm_session, responder_session
from statemachine.state import Checkpoint, FlowState, FlowStatus, InitiatedBy, StartedLocally


def start_flow(_: None, event: StartFlow) -> TransitionResult:
    """A flow started on this node: its Unstarted checkpoint commits, then it runs."""
    checkpoint = Checkpoint(
        flow_id=event.flow_id,
        origin=event.origin,
        status=FlowStatus.UNSTARTED,
        created_at=event.at,
        session_tag=event.session_tag,
        version=1,
    )
    actions: tuple[Action, ...] = (PersistCheckpoint(checkpoint, event.at),)
    state = FlowState(checkpoint=replace(checkpoint, status=FlowStatus.RUNNABLE))
    return TransitionResult(state, actions, Resume(None))


def start_initiated_flow(_: None, event: StartInitiatedFlow) -> TransitionResult:
    """A responder started by a peer's initial message: it confirms and runs at once."""
    session = responder_session(event.initial, event.sender, event.flow_version, event.app_name)
    checkpoint = Checkpoint(
        flow_id=event.flow_id,
        origin=InitiatedBy(
            event.flow_class,
            session.session_id,
            event.sender,
            event.initial.flow_version,
            event.initial.app_name,
        ),
        status=FlowStatus.RUNNABLE,
        created_at=event.at,
        sessions=(session,),
        session_tag=event.session_tag,
    )
    record = InboundRecord(event.message_id, event.sender, session.session_id, 0)
    state = FlowState(checkpoint=checkpoint, unrecorded_inbound=(record,), uncommitted_steps=1)
    state = confirm_session(state, session.session_id)
    return TransitionResult(state, (), Resume(None))


UNTRUSTED_CHECKPOINT = "persistence.store.CheckpointIntegrityError"
"""The error class recorded for a flow whose checkpoint could not be trusted (a placeholder
is loaded, never run: retrying it is refused until its checkpoint is restored)."""
KEPT_IN_HOSPITAL = "flows.errors.FlowFailedError"
"""The error class recorded for a flow kept in the hospital by the node or an operator."""


def load_flow(_: None, event: LoadFlow) -> TransitionResult:
    """A flow as the store found it: untrusted, kept, or restored to replay.

    An untrusted checkpoint (``stored.problem``) is not the flow: a placeholder is kept in
    the hospital with the reason, never run, and its row says so. A flow whose row says it is
    kept stays kept. Any other is restored (:func:`restore_flow`).
    """
    stored = event.stored
    if stored.checkpoint is None:
        reason = stored.problem or "its checkpoint cannot be trusted"
        placeholder = Checkpoint(
            flow_id=stored.flow_id,
            origin=StartedLocally(stored.flow_class, b""),
            status=FlowStatus.HOSPITALIZED,
            created_at=stored.created_at,
            error=FlowError(ErrorKind.INTERNAL, UNTRUSTED_CHECKPOINT, reason),
        )
        actions: tuple[Action, ...] = ()
        if stored.row_status is not FlowStatus.HOSPITALIZED or stored.row_reason != reason:
            actions = (RecordStatus(stored.flow_id, FlowStatus.HOSPITALIZED, reason),)
        return TransitionResult(FlowState(placeholder), actions, ProcessEvents())
    checkpoint = stored.checkpoint
    kept = FlowStatus.HOSPITALIZED
    if stored.row_status is kept and checkpoint.status is not kept:
        reason = stored.row_reason or "kept in the hospital"
        error = FlowError(ErrorKind.INTERNAL, KEPT_IN_HOSPITAL, reason)
        checkpoint = replace(checkpoint, status=FlowStatus.HOSPITALIZED, error=error)
    return restore_flow(None, RestoreFlow(checkpoint, event.at))


def restore_flow(_: None, event: RestoreFlow) -> TransitionResult:
    """A flow restored from its checkpoint: it replays its journal (or stays kept)."""
    checkpoint = event.checkpoint
    if checkpoint.status is FlowStatus.HOSPITALIZED:
        return TransitionResult(FlowState(checkpoint, len(checkpoint.journal)), (), ProcessEvents())
    if checkpoint.status not in (FlowStatus.UNSTARTED, FlowStatus.RUNNABLE, FlowStatus.SUSPENDED):
        raise IllegalTransitionError(checkpoint.flow_id, checkpoint.status.value, event)
    replaying = bool(checkpoint.journal) or checkpoint.pending is not None
    status = FlowStatus.REPLAYING if replaying else FlowStatus.RUNNABLE
    state = FlowState(replace(checkpoint, status=status), replay_cursor=0)
    return TransitionResult(state, (), Resume(None))


def reject_initial_session(
    initial_message_id: str, sender: str, initial: InitialSessionMessage, reason: str, at: float
) -> tuple[Action, ...]:
    """Actions that refuse a peer's session when no responder can be started for it."""
    our_session = responder_session_id(initial.initiator_session_id)
    reply = OutboundSessionMessage(
        message_id(our_session, 0),
        sender,
        ExistingSessionMessage(initial.initiator_session_id, 0, SessionReject(reason)),
    )
    record = InboundRecord(initial_message_id, sender, our_session, 0)
    return (
        RecordInboundMessages((record,), at),
        WriteOutbox((reply,), at),
        AcknowledgeMessages((initial_message_id,)),
        HandOffMessages((reply,)),
    )
