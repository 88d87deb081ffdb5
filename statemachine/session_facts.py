"""The few facts of a flow's sessions its row keeps: sent, received, confirmed.

A flow's sessions live in its checkpoint blob, sealed with its node's key and deleted when
the flow ends. The cross-node checks need three facts of each session after that too (a
record no sender sent, a last dedup id lost, a responder gone after it confirmed), so the
checkpoint row, and the result or error row a finished flow leaves, keep them beside the
flow, written in the same statement as the row (``persistence/sql_transaction.py``).
They are derived from the state (pure); see :class:`SessionFacts`.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from statemachine.state import SessionState


@attrs.frozen
class SessionFacts:
    """What one session of a flow says about its messages, as its row keeps it."""

    session_id: str
    """Our end's session id (``S`` for a session we opened, ``S.r`` for a responder's)."""
    sent: int
    """Messages the flow sent on it: the next sequence number it would send
    (``next_send_sequence``), counting the initial message, a confirmation and an end."""
    received: int
    """Messages it took in, in order (``next_receive_sequence``): each has its dedup id,
    written in the transaction that took it in (messages held early are not counted)."""
    confirmed: bool
    """The peer's responder confirmed the session (its first message, taken in; a refusal
    never is one). Always true for a responder's own session."""


def session_facts(sessions: Iterable[SessionState]) -> tuple[SessionFacts, ...]:
    """The facts of ``sessions`` (a checkpoint's), in their order."""
    return tuple(
        SessionFacts(
            session.session_id,
            session.next_send_sequence,
            session.next_receive_sequence,
            session.confirmed,
        )
        for session in sessions
    )
