"""Where an inbound session message goes: a pure decision, made before anything changes.

:func:`route` reads the message, its decoded body and what the scheduler holds (the
:class:`~statemachine.flow_table.FlowTable`), and returns one decision; the scheduler
carries it out:

* :class:`Deliver` to the flow owning the session;
* :class:`Wake` the dormant flow that owns the session (then route the message again);
* :class:`Start` a responder flow for a peer's initial message;
* :class:`Reject` the session (no responder for it here, or the node is draining);
* :class:`Hold` for a flow waiting for its retry after a failure;
* :class:`Park` until the session opens (or for a kept flow whose sessions are unknown);
* :class:`DropLate` a message for a session that is over;
* :class:`DeadLetter` anything that breaks a rule, with the reason.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Union

import attrs

from statemachine.flow_table import FlowTable
from statemachine.ports import InboundMessage, Responder, ResponderRegistry
from statemachine.session_ids import (
    identity_tag,
    is_bound_to,
    is_responder_session_id,
    message_id,
    owner_of_session,
    peer_session_id,
    responder_flow_id,
)
from statemachine.session_messages import (
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionMessage,
)
from statemachine.state import FlowStatus

MAX_REORDER_WINDOW = 1024
"""A message further ahead of its session's next expected sequence number is refused."""


@attrs.frozen
class Deliver:
    """Hand the message to ``flow_id``, which owns the session."""

    flow_id: str
    message: ExistingSessionMessage


@attrs.frozen
class Wake:
    """Restore ``flow_id``, dormant, which owns the message's session; then route it again."""

    flow_id: str


@attrs.frozen
class Start:
    """Start ``responder`` as flow ``flow_id`` for the peer's initial message."""

    flow_id: str
    responder: Responder
    initial: InitialSessionMessage


@attrs.frozen
class Reject:
    """Refuse the peer's session with ``reason`` (it is told, and the message consumed)."""

    reason: str
    initial: InitialSessionMessage


@attrs.frozen
class Hold:
    """Hold the message for ``flow_id``, which waits for its retry after a failure."""

    flow_id: str


@attrs.frozen
class Park:
    """Keep the message until ``session_id`` opens.

    With ``kept_flow``: held for that kept flow, whose sessions are unknown, without a time
    limit.
    """

    session_id: str
    kept_flow: str | None = None


@attrs.frozen
class DropLate:
    """The message is for ``session_id``, which is over: nothing will read it."""

    session_id: str


@attrs.frozen
class DeadLetter:
    """The message breaks a rule: keep it with ``reason``, never process it."""

    reason: str


Route = Union[Deliver, Wake, Start, Reject, Hold, Park, DropLate, DeadLetter]
"""Every decision :func:`route` makes."""


@attrs.frozen
class RoutingContext:
    """What routing needs to know about the node itself."""

    our_identity: str
    responders: ResponderRegistry
    draining: bool = False


def route(
    message: InboundMessage,
    decoded: SessionMessage,
    flows: FlowTable,
    context: RoutingContext,
    consumed: Container[str],
) -> Route:
    """Decide where ``message`` goes (see the module docstring).

    ``consumed`` holds the ids recorded as consumed before (checked in one query for a
    batch, initial messages of responder sessions included).
    """
    if isinstance(decoded, InitialSessionMessage):
        return _route_initial(message, decoded, flows, context)
    return _route_existing(message, decoded, flows, consumed)


def initial_message_of(session_id: str) -> str | None:
    """For a responder's session id, the id of the initial message that opens it."""
    if not is_responder_session_id(session_id):
        return None
    return message_id(peer_session_id(session_id), 0)


def _route_initial(
    message: InboundMessage,
    initial: InitialSessionMessage,
    flows: FlowTable,
    context: RoutingContext,
) -> Route:
    expected_id = message_id(initial.initiator_session_id, 0)
    if message.message_id != expected_id:
        return DeadLetter(f"initial session message must have id {expected_id}")
    if not is_bound_to(initial.initiator_session_id, message.sender):
        return DeadLetter(
            f"session id {initial.initiator_session_id!r} is not {message.sender}'s: a "
            f"session opened by it starts with its tag {identity_tag(message.sender)}-"
        )
    responder = context.responders.responder_for(initial.initiator_flow_class)
    if context.draining:
        return Reject(f"{context.our_identity} is draining: it starts no new flows", initial)
    if responder is None:
        name = initial.initiator_flow_class.rsplit(".", 1)[-1]
        return Reject(
            f"{context.our_identity} has no flow registered to respond to "
            f"{initial.initiator_flow_class} (install the CorDapp whose flow is annotated "
            f"@initiated_by({name}))",
            initial,
        )
    flow_id = responder_flow_id(message.sender, initial.initiator_session_id)
    if flows.is_dormant(flow_id):
        return Wake(flow_id)  # (a consumed copy is dropped before routing: this is a bug's)
    existing = flows.get(flow_id)
    if existing is not None and existing.holding:
        return Hold(flow_id)  # its first step failed: it is retried with this message
    if existing is not None:
        return DeadLetter(f"session {initial.initiator_session_id} already open")
    return Start(flow_id, responder, initial)


def _route_existing(
    message: InboundMessage,
    decoded: ExistingSessionMessage,
    flows: FlowTable,
    consumed: Container[str],
) -> Route:
    session_id = decoded.recipient_session_id
    expected_id = message_id(peer_session_id(session_id), decoded.sequence)
    if message.message_id != expected_id:
        return DeadLetter(
            f"message id {message.message_id} does not match its session and sequence "
            f"(expected {expected_id})"
        )
    owner = flows.owner_of(session_id)
    if owner is None:
        dormant = owner_of_session(session_id, message.sender)
        if flows.is_dormant(dormant):
            return Wake(dormant)
        return _route_unknown_session(message, session_id, flows, consumed)
    runtime = flows.get(owner)
    assert runtime is not None
    session = runtime.state.checkpoint.session(session_id)
    if session is None or session.counterparty != message.sender:
        return DeadLetter(f"session {session_id} does not belong to sender {message.sender}")
    if decoded.sequence >= session.next_receive_sequence + MAX_REORDER_WINDOW:
        return DeadLetter(
            f"sequence number {decoded.sequence} is too far ahead of session {session_id} "
            f"(expecting {session.next_receive_sequence}, window {MAX_REORDER_WINDOW})"
        )
    if runtime.holding:
        return Hold(owner)
    return Deliver(owner, decoded)


def _route_unknown_session(
    message: InboundMessage, session_id: str, flows: FlowTable, consumed: Container[str]
) -> Route:
    """A message for a session no flow owns: not opened yet, or already over."""
    kept = _kept_flow_for(session_id, message.sender, flows)
    if kept is not None:
        # Its flow is in the hospital with a checkpoint that could not be read (so its
        # sessions are unknown): hold it, unacknowledged and without a time limit, until
        # an operator retries the flow (then it is taken in) or kills it.
        return Park(session_id, kept_flow=kept)
    initial = initial_message_of(session_id)
    if initial is not None and initial not in consumed:
        # The initial message has not been taken in yet: wait for it (unacknowledged),
        # within bounds, so that a sender cannot fill our memory with such messages.
        return Park(session_id)
    return DropLate(session_id)


def _kept_flow_for(session_id: str, sender: str, flows: FlowTable) -> str | None:
    """The hospitalized flow that ``session_id`` belongs to but its checkpoint lacks.

    Session ids derive from flow ids, so the owner is known even when its checkpoint could
    not be read. None when there is no such flow.
    """
    flow_id = owner_of_session(session_id, sender)
    runtime = flows.get(flow_id)
    if runtime is None or runtime.state.status is not FlowStatus.HOSPITALIZED:
        return None
    return flow_id if runtime.state.checkpoint.session(session_id) is None else None
