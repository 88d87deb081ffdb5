"""The session protocol between two flows: one frozen class per message kind.

A session is opened by the initiator's :class:`InitialSessionMessage` (carrying the first
payload, if the initiator sends first). Every later message is an
:class:`ExistingSessionMessage` addressed to the recipient's session id, with a per-session
sequence number and one body: confirm, data, end, error or reject.

Session ids and message ids are deterministic (their grammar is in
:mod:`statemachine.session_ids`), so a replayed or re-sent message carries the id it had the
first time.

Each message class states its wire format once, in its annotations: field types, text limits
and ranges (:mod:`statemachine.wire_fields`); ``validate()`` checks a message from a peer
against them, and the codec calls it on everything it decodes.
"""

from __future__ import annotations

from typing import Annotated, Union

import attrs

from statemachine.flow_error import ErrorKind, FlowError
from statemachine.limits import (
    APP_NAME_CHARS,
    FLOW_CLASS_CHARS,
    INITIATOR_SESSION_ID_CHARS,
    MAX_SEQUENCE,
    REJECT_REASON_CHARS,
    SESSION_ID_CHARS,
)
from statemachine.wire_fields import Range, Text, WirePart


@attrs.frozen
class InitialSessionMessage(WirePart):
    """Opens a session: names the initiating flow class so the peer can start its responder."""

    initiator_session_id: Annotated[str, Text(INITIATOR_SESSION_ID_CHARS)]
    initiator_flow_class: Annotated[str, Text(FLOW_CLASS_CHARS)]
    flow_version: int
    app_name: Annotated[str, Text(APP_NAME_CHARS, may_be_empty=True)]
    first_payload: bytes | None


@attrs.frozen
class ConfirmSession(WirePart):
    """The responder flow started; carries its version and app name."""

    flow_version: int
    app_name: Annotated[str, Text(APP_NAME_CHARS, may_be_empty=True)]


@attrs.frozen
class SessionData(WirePart):
    """A payload sent with ``send``."""

    payload: bytes


@attrs.frozen
class SessionEnd(WirePart):
    """The sender's flow closed the session or finished."""


@attrs.frozen
class SessionErrorBody(WirePart):
    """The sender's flow failed; ``error`` says how much the receiver may learn."""

    error: FlowError


@attrs.frozen
class SessionReject(WirePart):
    """The peer node could not start a responder (no flow registered for the initiator)."""

    reason: Annotated[str, Text(REJECT_REASON_CHARS, may_be_empty=True)]


SessionBody = Union[ConfirmSession, SessionData, SessionEnd, SessionErrorBody, SessionReject]
"""Bodies an existing-session message can carry."""


@attrs.frozen
class ExistingSessionMessage(WirePart):
    """A message on an established session, addressed to the recipient's session id.

    Each side of a session numbers its own messages from 0.
    """

    recipient_session_id: Annotated[str, Text(SESSION_ID_CHARS)]
    sequence: Annotated[int, Range(0, MAX_SEQUENCE)]
    body: SessionBody


SessionMessage = Union[InitialSessionMessage, ExistingSessionMessage]
"""Every message flows exchange."""

WIRE_CLASSES: tuple[type, ...] = (
    InitialSessionMessage,
    ExistingSessionMessage,
    ConfirmSession,
    SessionData,
    SessionEnd,
    SessionErrorBody,
    SessionReject,
    FlowError,
    ErrorKind,
)
"""Every class a session message on the wire is made of (the codec's allow-list)."""


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
