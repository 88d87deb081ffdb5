"""The session protocol between two flows: one frozen class per message kind.

A session is opened by the initiator's :class:`InitialSessionMessage` (carrying the first
payload, if the initiator sends first). Every later message is an
:class:`ExistingSessionMessage` addressed to the recipient's session id, with a per-session
sequence number and one body: confirm, data, end, error or reject.

Session ids and message ids are deterministic (their grammar is in
:mod:`statemachine.session_ids`), so a replayed or re-sent message carries the id it had the
first time.
"""

from __future__ import annotations

from typing import Union

import attrs

from statemachine.flow_error import FlowError


@attrs.frozen
class InitialSessionMessage:
    """Opens a session: names the initiating flow class so the peer can start its responder."""

    initiator_session_id: str
    initiator_flow_class: str
    flow_version: int
    app_name: str
    first_payload: bytes | None


@attrs.frozen
class ConfirmSession:
    """The responder flow started; carries its version and app name."""

    flow_version: int
    app_name: str


@attrs.frozen
class SessionData:
    """A payload sent with ``send``."""

    payload: bytes


@attrs.frozen
class SessionEnd:
    """The sender's flow closed the session or finished."""


@attrs.frozen
class SessionErrorBody:
    """The sender's flow failed; ``error`` says how much the receiver may learn."""

    error: FlowError


@attrs.frozen
class SessionReject:
    """The peer node could not start a responder (no flow registered for the initiator)."""

    reason: str


SessionBody = Union[ConfirmSession, SessionData, SessionEnd, SessionErrorBody, SessionReject]
"""Bodies an existing-session message can carry."""


@attrs.frozen
class ExistingSessionMessage:
    """A message on an established session, addressed to the recipient's session id."""

    recipient_session_id: str
    sequence: int
    body: SessionBody


SessionMessage = Union[InitialSessionMessage, ExistingSessionMessage]
"""Every message flows exchange."""


@attrs.frozen
class OutboundSessionMessage:
    """A session message ready for the outbox: its dedup id and the party it goes to."""

    message_id: str
    target: str
    message: SessionMessage


@attrs.frozen
class InboundRecord:
    """What is recorded about a consumed inbound message (the dedup table row)."""

    message_id: str
    sender: str
    session_id: str
    sequence: int
