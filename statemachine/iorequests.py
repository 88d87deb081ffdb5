"""What a suspended flow asks the state machine for: one frozen class per kind of request.

A flow's ``call()`` never does I/O itself. Each session operation, sleep or non-deterministic
value becomes one of these requests, handed to the scheduler when the flow suspends. Every
request has a *signature*: the plain-data description that the journal stores and that replay
compares, so that a flow which asks for something else on replay is caught as
non-deterministic (see :mod:`statemachine.transition`).
"""

from __future__ import annotations

import hashlib
from typing import Union

import attrs

Plain = Union[None, bool, int, float, str, bytes, tuple["Plain", ...]]
"""A value that msgpack carries unchanged: what journals and signatures are made of."""


def payload_digest(payload: bytes) -> str:
    """A short, stable fingerprint of serialized payload bytes, for journal signatures."""
    return hashlib.sha256(payload).hexdigest()[:16]


@attrs.frozen
class SessionPayload:
    """One serialized payload addressed to one of the flow's sessions."""

    session_id: str
    payload: bytes


@attrs.frozen
class InitiateSession:
    """Open a session with ``counterparty`` on behalf of the initiating flow class named."""

    counterparty: str
    initiating_flow: str
    flow_version: int
    app_name: str

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind, counterparty and initiating flow."""
        return ("InitiateSession", self.counterparty, self.initiating_flow)

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"initiate_flow({self.counterparty}) from {self.initiating_flow}"


@attrs.frozen
class Send:
    """Send one payload on each of the given sessions, in order."""

    payloads: tuple[SessionPayload, ...]

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind, sessions and payload fingerprints."""
        return ("Send", *tuple((p.session_id, payload_digest(p.payload)) for p in self.payloads))

    def describe(self) -> str:
        """Human-readable form for error messages."""
        parts = ", ".join(
            f"{p.session_id} (payload {payload_digest(p.payload)})" for p in self.payloads
        )
        return f"send on {parts}"


@attrs.frozen
class Receive:
    """Wait for the next message on each of the given sessions (results in list order)."""

    session_ids: tuple[str, ...]
    timeout: float | None = None
    """Seconds to wait before the flow gets ``FlowTimeoutException``; None waits forever.

    Not part of the signature: a node's default may change between a run and its replay.
    """

    def __attrs_post_init__(self) -> None:
        if not self.session_ids:
            raise ValueError("Receive needs at least one session")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"a receive timeout must be positive, not {self.timeout}")
        if len(set(self.session_ids)) != len(self.session_ids):
            raise ValueError(f"Receive names a session twice: {self.session_ids}")

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind and sessions."""
        return ("Receive", *self.session_ids)

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"receive on {', '.join(self.session_ids)}"


@attrs.frozen
class CloseSessions:
    """End the given sessions: the counterparty sees the end on its next receive."""

    session_ids: tuple[str, ...]

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind and sessions."""
        return ("CloseSessions", *self.session_ids)

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"close {', '.join(self.session_ids)}"


@attrs.frozen
class Sleep:
    """Suspend for ``seconds``; the wake-up time is durable (kept in the checkpoint)."""

    seconds: float

    def __attrs_post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError(f"sleep needs a non-negative duration, got {self.seconds!r}")

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind and duration."""
        return ("Sleep", float(self.seconds))

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"sleep({self.seconds})"


@attrs.frozen
class RecordValue:
    """Journal a non-deterministic value (``now``, ``random``, ``uuid``).

    ``candidate`` is the value computed live; on replay the journaled value is returned
    instead, so flow code sees the same value every time it runs.
    """

    name: str
    candidate: Plain

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind and value name (never the value)."""
        return ("RecordValue", self.name)

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"{self.name}()"


@attrs.frozen
class RunInTransaction:
    """Run the flow's ``ordinal``-th side effect in the transaction that commits this step.

    The effect itself (a callable) stays with the fiber; the journal records that it was
    asked for, so a replay never runs it again, and a step that never committed runs it
    once when it is redone.
    """

    label: str
    ordinal: int

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind, label and ordinal."""
        return ("RunInTransaction", self.label, self.ordinal)

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"in_transaction({self.label!r}, #{self.ordinal})"


@attrs.frozen
class SetProgress:
    """The flow reached a named step of its progress tracker (stored in the checkpoint)."""

    step: str

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind and step."""
        return ("SetProgress", self.step)

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"progress({self.step!r})"


IORequest = Union[
    InitiateSession, Send, Receive, CloseSessions, Sleep, RecordValue, RunInTransaction, SetProgress
]
"""Every kind of request a flow can suspend with."""

BLOCKING_REQUESTS = (Receive, Sleep)
"""Request kinds that may leave the flow waiting (and so become a checkpoint's pending request)."""
