"""Pure session rules: opening, sending, receiving, closing and taking in messages.

Each function takes a :class:`FlowState` and returns a new one; none of them decides when to
commit or what the fiber does next (that is :mod:`statemachine.transition`'s job). Outbound
messages are appended to ``FlowState.unsent_outbound`` and inbound ones are noted in
``FlowState.unrecorded_inbound``, to be written by the next commit.
"""

from __future__ import annotations

from typing import Any

from statemachine.errors import UnknownSessionError
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.immutable import replace
from statemachine.iorequests import (
    UNKNOWN_PARTY_EXCEPTION,
    InitiateSession,
    Receive,
    SessionPayload,
)
from statemachine.session_ids import (
    initiator_session_id,
    message_id,
    responder_session_id,
)
from statemachine.session_messages import (
    ConfirmSession,
    ExistingSessionMessage,
    InboundRecord,
    InitialSessionMessage,
    OutboundSessionMessage,
    SessionBody,
    SessionData,
    SessionEnd,
    SessionErrorBody,
    SessionReject,
)
from statemachine.state import (
    NO_VALUE,
    EarlyMessage,
    FlowState,
    InboxItem,
    Outcome,
    Raised,
    ReceiveProgress,
    SessionState,
    Value,
)


def _session(state: FlowState, session_id: str) -> SessionState:
    session = state.checkpoint.session(session_id)
    if session is None:
        raise UnknownSessionError(state.flow_id, session_id)
    return session


def _replace_session(state: FlowState, session: SessionState, **changes: Any) -> FlowState:
    """``state`` with ``session`` put in its checkpoint and ``changes`` made, one copy each."""
    checkpoint = state.checkpoint
    sessions = checkpoint.sessions.put(session)
    return replace(state, checkpoint=replace(checkpoint, sessions=sessions), **changes)


def _usage_error(message: str) -> Raised:
    return Raised(FlowError(ErrorKind.FLOW_EXCEPTION, "", message))


def error_for_terminal(session: SessionState, item: InboxItem) -> FlowError:
    """The error a flow sees when it meets the peer's end, error or reject on a session."""
    who = session.counterparty
    if isinstance(item, SessionEnd):
        return FlowError(
            ErrorKind.UNEXPECTED_END,
            "",
            f"Counterparty flow on {who} has completed without sending data "
            f"(session {session.session_id})",
        )
    if isinstance(item, SessionReject):
        return FlowError(ErrorKind.UNEXPECTED_END, "", item.reason)
    if isinstance(item, SessionErrorBody) and item.error.kind is ErrorKind.FLOW_EXCEPTION:
        return item.error
    return FlowError(
        ErrorKind.UNEXPECTED_END,
        "",
        f"Counterparty flow on {who} had an internal error and has terminated "
        f"(session {session.session_id})",
    )


def _outbound_message(
    session: SessionState, body: SessionBody | None, payload: bytes | None, **changes: Any
) -> tuple[OutboundSessionMessage, SessionState]:
    """The next message from ``session`` and the session once it is queued.

    The message is the initial message if the session has not sent that yet. ``changes`` are
    made to the session in the same copy.
    """
    sequence = session.next_send_sequence
    outbound: InitialSessionMessage | ExistingSessionMessage
    if not session.initial_sent:
        outbound = InitialSessionMessage(
            initiator_session_id=session.session_id,
            initiator_flow_class=session.initiating_flow,
            flow_version=session.flow_version,
            app_name=session.app_name,
            first_payload=payload,
        )
    else:
        assert body is not None
        outbound = ExistingSessionMessage(session.peer_session_id, sequence, body)
    message = OutboundSessionMessage(
        message_id(session.session_id, sequence), session.counterparty, outbound
    )
    return message, replace(session, initial_sent=True, next_send_sequence=sequence + 1, **changes)


def _queue_outbound(
    state: FlowState, session: SessionState, body: SessionBody | None, payload: bytes | None
) -> tuple[FlowState, SessionState]:
    """Queue the next message from ``session``: the initial message if not yet sent."""
    message, session = _outbound_message(session, body, payload)
    outbound = state.unsent_outbound.append(message)
    return _replace_session(state, session, unsent_outbound=outbound), session


def _queue_many(
    state: FlowState,
    queued: list[tuple[OutboundSessionMessage, SessionState]],
    checkpoint_changes: dict[str, Any] | None = None,
    **changes: Any,
) -> FlowState:
    """Queue ``queued``'s messages and put in their sessions, all in one update.

    ``checkpoint_changes`` and ``changes`` (of the checkpoint, of the state) are made in the
    same copies.
    """
    if not queued and not checkpoint_changes and not changes:
        return state
    checkpoint = state.checkpoint
    sessions = checkpoint.sessions.put_many(session for _, session in queued)
    checkpoint = replace(checkpoint, sessions=sessions, **(checkpoint_changes or {}))
    if queued:
        changes["unsent_outbound"] = state.unsent_outbound.extend(m for m, _ in queued)
    return replace(state, checkpoint=checkpoint, **changes)


def open_session(state: FlowState, request: InitiateSession) -> tuple[FlowState, Outcome]:
    """Create a new session with ``request.counterparty``; nothing is sent yet.

    A counterparty the network map did not know gets no session: the flow is resumed with
    :data:`~statemachine.iorequests.UNKNOWN_PARTY_EXCEPTION` (journaled like any outcome).
    """
    if request.unknown_because:
        message = (
            f"initiate_flow from {request.initiating_flow} cannot reach "
            f"{request.counterparty}: {request.unknown_because}"
        )
        return state, Raised(FlowError(ErrorKind.INTERNAL, UNKNOWN_PARTY_EXCEPTION, message))
    index = state.checkpoint.next_session_index
    session_id = initiator_session_id(state.flow_id, index, state.checkpoint.session_tag)
    session = SessionState(
        session_id=session_id,
        peer_session_id=responder_session_id(session_id),
        counterparty=request.counterparty,
        initiated_by_us=True,
        initiating_flow=request.initiating_flow,
        flow_version=request.flow_version,
        app_name=request.app_name,
    )
    checkpoint = state.checkpoint
    checkpoint = replace(
        checkpoint, sessions=checkpoint.sessions.put(session), next_session_index=index + 1
    )
    return replace(state, checkpoint=checkpoint), Value(session_id)


def responder_session(
    initial: InitialSessionMessage, sender: str, flow_version: int, app_name: str
) -> SessionState:
    """The responder's side of a session opened by ``initial`` (sequence 0 already taken in)."""
    inbox: tuple[InboxItem, ...] = ()
    if initial.first_payload is not None:
        inbox = (SessionData(initial.first_payload),)
    return SessionState(
        session_id=responder_session_id(initial.initiator_session_id),
        peer_session_id=initial.initiator_session_id,
        counterparty=sender,
        initiated_by_us=False,
        initiating_flow=initial.initiator_flow_class,
        flow_version=flow_version,
        app_name=app_name,
        initial_sent=True,
        confirmed=True,
        peer_flow_version=initial.flow_version,
        peer_app_name=initial.app_name,
        next_send_sequence=0,
        next_receive_sequence=1,
        inbox=inbox,
    )


def confirm_session(state: FlowState, session_id: str) -> FlowState:
    """Queue the responder's confirm message (sequence 0 of its direction)."""
    session = _session(state, session_id)
    body = ConfirmSession(session.flow_version, session.app_name)
    state, _ = _queue_outbound(state, session, body, None)
    return state


def send_payloads(
    state: FlowState, payloads: tuple[SessionPayload, ...]
) -> tuple[FlowState, Outcome]:
    """Queue one data message per payload, or refuse all of them if any session can't send."""
    for item in payloads:
        session = _session(state, item.session_id)
        refusal = _refuse_send(session)
        if refusal is not None:
            return state, refusal
    if len(payloads) == 1:
        item = payloads[0]
        session = _session(state, item.session_id)
        state, _ = _queue_outbound(state, session, SessionData(item.payload), item.payload)
        return state, NO_VALUE
    queued: list[tuple[OutboundSessionMessage, SessionState]] = []
    latest: dict[str, SessionState] = {}  # a payload list may name a session twice
    for item in payloads:
        session = latest.get(item.session_id) or _session(state, item.session_id)
        message, latest[item.session_id] = _outbound_message(
            session, SessionData(item.payload), item.payload
        )
        queued.append((message, latest[item.session_id]))
    return _queue_many(state, queued), NO_VALUE


def _refuse_send(session: SessionState) -> Raised | None:
    if session.closed_by_us:
        return _usage_error(
            f"Cannot send on session {session.session_id} with {session.counterparty}: "
            "this flow closed it"
        )
    for item in session.inbox:
        if not isinstance(item, SessionData):
            return Raised(error_for_terminal(session, item))
    return None


def ensure_initiated(state: FlowState, session_ids: tuple[str, ...]) -> FlowState:
    """Send the initial message (without payload) on sessions that have not sent it yet."""
    queued: list[tuple[OutboundSessionMessage, SessionState]] = []
    for session_id in session_ids:
        session = _session(state, session_id)
        if not session.initial_sent and not session.closed_by_us:
            queued.append(_outbound_message(session, None, None))
    return _queue_many(state, queued)


def try_receive(state: FlowState, request: Receive) -> tuple[FlowState, Outcome | None]:
    """Take the next message of every session in ``request``, or None if one must wait.

    A session whose next item is the peer's end, error or reject fails the whole receive at
    once (the first such session in list order decides the error); that item stays put, so
    every later receive on the session fails the same way. Taking the messages updates every
    session in one step.
    """
    sessions = [_session(state, session_id) for session_id in request.session_ids]
    for session in sessions:
        if session.closed_by_us:
            return state, _usage_error(
                f"Cannot receive on session {session.session_id} with "
                f"{session.counterparty}: this flow closed it"
            )
        terminal = session.terminal_item()
        if terminal is not None:
            return state, Raised(error_for_terminal(session, terminal))
    if any(not session.inbox for session in sessions):
        return state, None
    payloads: list[bytes] = []
    taken: list[SessionState] = []
    for session in sessions:
        head = session.inbox[0]
        assert isinstance(head, SessionData)
        payloads.append(head.payload)
        taken.append(replace(session, inbox=session.inbox[1:]))
    checkpoint = state.checkpoint.with_sessions(taken)
    return replace(state, checkpoint=checkpoint), Value(tuple(payloads))


def receive_progress(state: FlowState, request: Receive) -> ReceiveProgress:
    """Where a receive that must wait stands now: how many sessions, in order, have a message."""
    ready = 0
    for session_id in request.session_ids:
        if not _session(state, session_id).inbox:
            break
        ready += 1
    return ReceiveProgress(request, frozenset(request.session_ids), ready)


def receive_after_delivery(
    state: FlowState, request: Receive, session_id: str
) -> tuple[FlowState, Outcome | None]:
    """``try_receive`` for a flow waiting on ``request`` once a message reached ``session_id``.

    Same outcome as :func:`try_receive`, without looking at every session each time: while
    the flow waits, sessions only gain messages, so the receive can newly fail only because
    of the session just delivered to, and can complete only once
    ``state.receive_progress.ready`` has passed every session (see :class:`ReceiveProgress`).
    """
    progress = state.receive_progress
    if progress is None or progress.request is not request:
        progress = receive_progress(state, request)
    if session_id in progress.members:
        if _session(state, session_id).terminal_item() is not None:
            return try_receive(state, request)
        session_ids, ready = request.session_ids, progress.ready
        while ready < len(session_ids) and _session(state, session_ids[ready]).inbox:
            ready += 1
        if ready == len(session_ids):
            return try_receive(state, request)
        if ready != progress.ready:
            progress = replace(progress, ready=ready)
    if progress is not state.receive_progress:
        state = replace(state, receive_progress=progress)
    return state, None


def close_sessions(state: FlowState, session_ids: tuple[str, ...]) -> tuple[FlowState, Outcome]:
    """End each session: tell the peer (if it knows the session) and refuse further use."""
    messages: list[OutboundSessionMessage] = []
    closed: dict[str, SessionState] = {}  # a list may name a session twice
    for session_id in session_ids:
        session = closed.get(session_id) or _session(state, session_id)
        if session.closed_by_us:
            continue
        if session.initial_sent and not session.peer_finished():
            message, session = _outbound_message(session, SessionEnd(), None, closed_by_us=True)
            messages.append(message)
        else:
            session = replace(session, closed_by_us=True)
        closed[session_id] = session
    checkpoint = state.checkpoint.with_sessions(closed.values())
    outbound = state.unsent_outbound.extend(messages)
    return replace(state, checkpoint=checkpoint, unsent_outbound=outbound), NO_VALUE


def end_all_sessions(
    state: FlowState, told: FlowError | None, **checkpoint_changes: Any
) -> FlowState:
    """On finish, or on failure, tell every peer still listening.

    ``told`` is None on finish, else the error the peers learn. ``checkpoint_changes`` (the
    flow's final status, say) are made in the same copy.
    """
    queued: list[tuple[OutboundSessionMessage, SessionState]] = []
    for session in state.checkpoint.sessions:
        if session.closed_by_us or not session.initial_sent or session.peer_finished():
            continue
        body: SessionBody = SessionEnd() if told is None else SessionErrorBody(told)
        message, session = _outbound_message(session, body, None, closed_by_us=True)
        queued.append((message, session))
    return _queue_many(state, queued, checkpoint_changes)


def take_in(
    state: FlowState, session_id: str, record: InboundRecord, body: SessionBody
) -> tuple[FlowState, bool]:
    """Accept an inbound message into its session, restoring sequence order.

    Returns ``(state, accepted)``; a message whose sequence number was already taken in (or
    is already waiting as an early message) is a duplicate and is not accepted.
    """
    session = _session(state, session_id)
    sequence = record.sequence
    expected = session.next_receive_sequence
    if sequence < expected or any(early.sequence == sequence for early in session.early):
        return state, False
    if sequence == expected and not session.early:  # in order: the usual case, one copy
        session = _apply_in_order(session, body, next_receive_sequence=expected + 1)
    else:
        early = sorted((*session.early, EarlyMessage(sequence, body)), key=_by_sequence)
        while early and early[0].sequence == expected:
            session = _apply_in_order(session, early.pop(0).body)
            expected += 1
        session = replace(session, early=tuple(early), next_receive_sequence=expected)
    inbound = state.unrecorded_inbound.append(record)
    return _replace_session(state, session, unrecorded_inbound=inbound), True


def _by_sequence(message: EarlyMessage) -> int:
    return message.sequence


def _apply_in_order(session: SessionState, body: SessionBody, **changes: Any) -> SessionState:
    """``session`` once ``body``, the next in order, is taken in (and ``changes`` made)."""
    if isinstance(body, ConfirmSession):
        return replace(
            session,
            confirmed=True,
            peer_flow_version=body.flow_version,
            peer_app_name=body.app_name,
            **changes,
        )
    return replace(session, inbox=(*session.inbox, body), **changes)
