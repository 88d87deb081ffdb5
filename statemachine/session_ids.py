"""Session ids, message ids and responder flow ids: the grammar, in one public place.

Everything that makes or reads these ids (the transition rules, the scheduler's routing,
the store, the Spark checks in :mod:`persistence.analytics`) uses this module's functions,
or, where it cannot call Python (Spark column expressions), its constants.

* A session opened by flow ``F`` on the node with identity tag ``T`` (:func:`identity_tag`)
  is ``T-F.s<n>`` (its ``n``-th session); the responder's side of it is ``T-F.s<n>.r``, so
  the initiator knows where to send before any confirm arrives. The tag binds the id to the
  opening node: a receiver opens a session only under its sender's tag.
* Each direction of a session numbers its messages from 0 (the initial message, or the
  confirm/reject, is number 0); message ``k`` sent from session ``S`` has id ``N-S-k``.
* The responder a node starts for a session has a flow id derived from the sender and the
  initiator's session id (:func:`responder_flow_id`): a redelivered initial message maps to
  the same flow.
"""

from __future__ import annotations

import hashlib
import uuid

SESSION_SEPARATOR = ".s"
"""Between a flow id and the number of one of its sessions."""
MESSAGE_ID_PREFIX = "N-"
"""In front of every session message id."""
RESPONDER_NAMESPACE = uuid.UUID("6f1d3c1e-8a43-4e0f-9a57-1f6b2a7d0c11")
"""The UUID-5 namespace of responder flow ids (see :func:`responder_flow_id`)."""

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
    session = f"{flow_id}{SESSION_SEPARATOR}{index}"
    return f"{tag}-{session}" if tag else session


def is_bound_to(session_id: str, sender: str) -> bool:
    """True if the initiator session id ``session_id`` carries ``sender``'s identity tag."""
    return session_id.startswith(identity_tag(sender) + "-")


def flow_id_of_session(session_id: str) -> str:
    """The id of the flow that opened ``session_id`` (either end's id), tag stripped."""
    if is_responder_session_id(session_id):
        session_id = session_id[: -len(RESPONDER_SUFFIX)]
    flow_part = session_id.rsplit(SESSION_SEPARATOR, 1)[0]
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
        return session_id[: -len(RESPONDER_SUFFIX)]
    return responder_session_id(session_id)


def is_responder_session_id(session_id: str) -> bool:
    """True for the responder's side of a session (ids made by :func:`responder_session_id`)."""
    return session_id.endswith(RESPONDER_SUFFIX)


def message_id(sender_session_id: str, sequence: int) -> str:
    """The deterministic dedup id of message ``sequence`` sent from ``sender_session_id``."""
    return f"{MESSAGE_ID_PREFIX}{sender_session_id}-{sequence}"


def responder_flow_id(sender: str, initiator_session: str) -> str:
    """The flow id of the responder a node starts when ``sender`` opens ``initiator_session``.

    ``uuid5(RESPONDER_NAMESPACE, "<sender>|<initiator session id>")`` in hex: the same initial
    message, delivered again, maps to the same flow.
    """
    return uuid.uuid5(RESPONDER_NAMESPACE, f"{sender}|{initiator_session}").hex


def owner_of_session(session_id: str, sender: str) -> str:
    """The id of the flow on this node that owns ``session_id``, a session ``sender`` talks on.

    Session ids derive from flow ids: our end of a session we opened names our flow; our end
    of a session a peer opened names the peer's, and our responder's id derives from it and
    the sender. Whether that flow exists is for the caller to find out.
    """
    if is_responder_session_id(session_id):
        return responder_flow_id(sender, peer_session_id(session_id))
    return flow_id_of_session(session_id)
