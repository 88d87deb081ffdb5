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


UNKNOWN_PARTY_EXCEPTION = "flows.errors.UnknownPartyError"
"""What ``initiate_flow`` raises for a party the network map does not know."""


@attrs.frozen
class InitiateSession:
    """Open a session with ``counterparty`` on behalf of the initiating flow class named."""

    counterparty: str
    initiating_flow: str
    flow_version: int
    app_name: str
    unknown_because: str = ""
    """Empty if the node's network map knew ``counterparty`` when the flow asked; else why not
    (the flow gets :data:`UNKNOWN_PARTY_EXCEPTION`, journaled, so a replay sees the same)."""

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


def _positive_or_none(_: object, attribute: attrs.Attribute[float | None], value: object) -> None:
    if value is not None and not (isinstance(value, int | float) and 0 < value < float("inf")):
        raise ValueError(f"{attribute.name} must be a positive number of seconds, not {value!r}")


def _exception_names(classes: object) -> tuple[str, ...]:
    """``classes`` (exception classes or qualified names, or one of them) as names."""
    items = classes if isinstance(classes, tuple | list) else (classes,)
    names = []
    for item in items:
        if isinstance(item, str) and item:
            names.append(item)
        elif isinstance(item, type) and issubclass(item, BaseException):
            names.append(f"{item.__module__}.{item.__qualname__}")
        else:
            raise ValueError(f"retry_on takes exception classes or their names, not {item!r}")
    return tuple(names)


@attrs.frozen
class RetryPolicy:
    """How often an external operation is tried, and how long to wait between tries.

    Attempt ``n`` (from 1) that fails with an exception the policy retries is followed, after
    ``min(max_backoff, backoff * multiplier ** (n - 1))`` seconds spread by up to ``jitter``
    of themselves either way, by attempt ``n + 1``, up to ``attempts`` in all. ``retry_on``
    names the exception classes retried (classes or their qualified names; subclasses count):
    any other failure reaches the flow at once. An attempt that outlives its timeout is
    retried like a failure the policy retries.
    """

    attempts: int = 1
    """Attempts in all, the first included (1: never retried)."""
    backoff: float = 1.0
    """Seconds before the second attempt."""
    multiplier: float = 2.0
    """Each further wait is this many times the one before."""
    max_backoff: float = 60.0
    """No wait is longer than this (before the jitter)."""
    jitter: float = 0.2
    """The share of a wait it may be made shorter or longer by (0 to 1)."""
    retry_on: tuple[str, ...] = attrs.field(
        default=("builtins.Exception",), converter=_exception_names
    )
    """Qualified names of the exception classes retried."""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise ValueError(f"attempts must be an integer, not {self.attempts!r}")
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts}")
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 <= value < float("inf")):
                raise ValueError(f"{name} must be a non-negative number of seconds, not {value!r}")
        if not (isinstance(self.multiplier, int | float) and 1 <= self.multiplier < float("inf")):
            raise ValueError(f"multiplier must be at least 1, not {self.multiplier!r}")
        if not (isinstance(self.jitter, int | float) and 0 <= self.jitter <= 1):
            raise ValueError(f"jitter must be between 0 and 1, not {self.jitter!r}")

    def retries(self, error_type: type[BaseException]) -> bool:
        """True if a failure with an exception of ``error_type`` is retried (attempts left)."""
        names = {f"{cls.__module__}.{cls.__qualname__}" for cls in error_type.__mro__}
        return not names.isdisjoint(self.retry_on)

    def delay(self, attempt: int, spread: float) -> float:
        """Seconds to wait after failed attempt ``attempt``; ``spread`` in [0, 1) picks jitter."""
        base = min(self.max_backoff, self.backoff * self.multiplier ** (attempt - 1))
        return max(0.0, base * (1 + self.jitter * (2 * spread - 1)))


NO_RETRIES = RetryPolicy()
"""One attempt: a failure reaches the flow at once."""


@attrs.frozen
class RunOperation:
    """Run the flow's ``ordinal``-th external operation off the flow, and wait for its result.

    The callable stays with the node (its operation runner); the checkpoint keeps what the
    transition needs: the timeout, the retry policy, and how far the tries have got
    (``attempt``; ``backing_off`` while waiting before it). Those two are progress, not part
    of the signature.
    """

    label: str
    ordinal: int
    name: str
    """The callable's qualified name: a replay that calls another one is caught."""
    timeout: float | None = attrs.field(default=None, validator=_positive_or_none)
    """Seconds one attempt may run before it counts as failed (None: no limit)."""
    policy: RetryPolicy = NO_RETRIES
    attempt: int = 1
    """The attempt running, or (``backing_off``) the one waited for."""
    backing_off: bool = False

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind, label, ordinal and the callable's name."""
        return ("RunOperation", self.label, self.ordinal, self.name)

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"call_external({self.name}, label {self.label!r}, #{self.ordinal})"


@attrs.frozen
class ContinueAsNew:
    """End this run of ``call()`` and start the flow again, as new, with ``arguments``.

    ``arguments`` are the new instance's serialized constructor arguments. The flow keeps its
    id; its journal starts empty, so a flow that loops for ever replays only its last run.
    """

    arguments: bytes

    def signature(self) -> tuple[Plain, ...]:
        """The journal signature: kind and the arguments' fingerprint."""
        return ("ContinueAsNew", payload_digest(self.arguments))

    def describe(self) -> str:
        """Human-readable form for error messages."""
        return f"continue_as_new({payload_digest(self.arguments)})"


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
    InitiateSession,
    Send,
    Receive,
    CloseSessions,
    Sleep,
    RecordValue,
    RunInTransaction,
    RunOperation,
    SetProgress,
    ContinueAsNew,
]
"""Every kind of request a flow can suspend with."""

BLOCKING_REQUESTS = (Receive, Sleep, RunOperation)
"""Request kinds that may leave the flow waiting (and so become a checkpoint's pending request)."""
