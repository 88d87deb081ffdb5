"""The session protocol between two flows: one frozen class per message kind.

A session is opened by the initiator's :class:`InitialSessionMessage` (carrying the first
payload, if the initiator sends first). Every later message is an
:class:`ExistingSessionMessage` addressed to the recipient's session id, with a per-session
sequence number and one body: confirm, data, end, error or reject.

Ids are deterministic, so a replayed or re-sent message carries the id it had the first time:

* a session opened by flow ``F`` is ``F.s<n>`` (its ``n``-th session); the responder's side
  of it is ``F.s<n>.r``, so the initiator knows where to send before any confirm arrives;
* each direction of a session numbers its messages from 0 (the initial message, or the
  confirm/reject, is number 0) and message ``k`` of session ``S`` has id ``N-S-k``.
"""

from __future__ import annotations

import hashlib
from typing import Union

import attrs

from statemachine.flow_error import FlowError

RESPONDER_SUFFIX = ".r"


TAG_LENGTH = 16
"""Hex characters of an identity tag (64 bits: no node can grind a name to match another's)."""


def identity_tag(name: str) -> str:
    """The tag that binds a node's session ids to its name (a prefix of its SHA-256)."""
    return hashlib.sha256(name.encode()).hexdigest()[:TAG_LENGTH]


def initiator_session_id(flow_id: str, index: int, tag: str = "") -> str:
    """The id of the ``index``-th session opened by flow ``flow_id``.

    With the initiating node's ``tag`` (:func:`identity_tag`) in front: a receiver only opens
    a session whose id carries its sender's tag, so no node can open (and so squat on) a
    session id another node will use.
    """
    return f"{tag}-{flow_id}.s{index}" if tag else f"{flow_id}.s{index}"


def is_bound_to(session_id: str, sender: str) -> bool:
    """True if the initiator session id ``session_id`` carries ``sender``'s identity tag."""
    return session_id.startswith(identity_tag(sender) + "-")


def flow_id_of_session(session_id: str) -> str:
    """The id of the flow that opened ``session_id`` (either end's id), tag stripped."""
    if is_responder_session_id(session_id):
        session_id = session_id[: -len(RESPONDER_SUFFIX)]
    flow_part = session_id.rsplit(".s", 1)[0]
    head, dash, rest = flow_part.partition("-")
    if dash and len(head) == TAG_LENGTH and all(c in "0123456789abcdef" for c in head):
        return rest
    return flow_part


def responder_session_id(initiator_session: str) -> str:
    """The responder's id for the session the initiator calls ``initiator_session``."""
    return initiator_session + RESPONDER_SUFFIX


def peer_session_id(session_id: str) -> str:
    """The other end's session id: the initiator's for a responder's, and back."""
    if is_responder_session_id(session_id):
        return session_id[: -len(".r")]
    return responder_session_id(session_id)


def is_responder_session_id(session_id: str) -> bool:
    """True for the responder's side of a session (ids made by :func:`responder_session_id`)."""
    return session_id.endswith(RESPONDER_SUFFIX)


def message_id(sender_session_id: str, sequence: int) -> str:
    """The deterministic dedup id of message ``sequence`` sent from ``sender_session_id``."""
    return f"N-{sender_session_id}-{sequence}"


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
