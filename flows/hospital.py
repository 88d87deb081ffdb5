"""The flow hospital: what a node does when something goes wrong, by named rules.

Errors inside flow code are the flow's: a ``FlowException`` or any other exception fails
the flow and reaches its counterparties (as itself, or as an unexpected end). What reaches
the hospital is everything else, diagnosed by the first rule that matches:

``transient``
    The database is locked, busy or disconnected, or the transport is unavailable
    (``OperationalError``, ``InterfaceError``, an invalidated connection,
    ``TransportError``, ``ConnectionError``, ``TimeoutError``), also when one flow's side
    effect hit it. Nothing of the failed round was committed: the node drops its memory and
    resumes every flow from its last checkpoint, after a capped, jittered backoff (0.1 s
    doubling to 30 s, 50-100 % of it). A failure of one flow's step is counted against it.
``repeated_failure``
    The same flow's step failed ``MAX_FLOW_FAILURES`` times in a row (its counter starts
    again once it commits a later step): the flow is kept for observation (HOSPITALIZED, the
    reason recorded, the counterparties not told) until an operator retries or kills it; the
    others go on.
``flow_error``
    Anything else that one flow caused (its ``in_transaction`` effect raised a
    non-transient error, a ``ValueError`` say): that flow fails with the error, which
    propagates as any error in flow code does (its counterparties get
    ``UnexpectedFlowEndException``, its handle raises ``FlowEffectError``); the others
    resume.
``unknown``
    Anything else, that no flow can be blamed for (a bug outside flow code): resume from the
    last checkpoint after the backoff, logged as an error with its traceback. With no flow
    to fail, this is the one case the node can only retry.

Kept for observation without going through these rules (they are found when a flow is
loaded or replayed): ``non_determinism`` (replay found the flow asking for something else,
``FlowNonDeterminismError``), ``untrusted_checkpoint`` (its MAC does not match, or it does not
decode) and ``incompatible_checkpoint`` (the installed flows cannot resume it). Each rule has
a test that injects its error (``tests/test_hospital.py`` and the tests named in
docs/operations.md).
"""

from __future__ import annotations

import enum
import random

import attrs
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from flows.effects import FlowEffectError
from messaging.service import TransportError

MAX_FLOW_FAILURES = 3
"""Failures of one flow's step, in a row, after which it is kept for observation."""
MIN_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 30.0


class Treatment(enum.Enum):
    """What the node does about a diagnosed error."""

    RESUME = "resume from the last checkpoint after a backoff"
    KEEP = "keep the flow for observation"
    FAIL = "fail the flow with the error"


@attrs.frozen
class Diagnosis:
    """The rule that matched, what to do, and the flow concerned (if one is)."""

    rule: str
    treatment: Treatment
    flow_id: str | None
    reason: str


def is_transient(error: BaseException) -> bool:
    """True for errors that go away by themselves (see the ``transient`` rule)."""
    if isinstance(error, OperationalError | InterfaceError | TransportError):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, ConnectionError | TimeoutError)


class Hospital:
    """Diagnoses errors and remembers each flow's failures in a row."""

    def __init__(self, seed: int | None = None) -> None:
        self._failures: dict[str, int] = {}
        self._random = random.Random(seed)
        self.consecutive = 0
        """Rounds that failed in a row (any cause); sets the backoff."""

    def diagnose(self, error: BaseException) -> Diagnosis:
        """The first rule that matches ``error`` (see the module docstring)."""
        self.consecutive += 1
        flow_id = error.flow_id if isinstance(error, FlowEffectError) else None
        if is_transient(error) or (error.__cause__ is not None and is_transient(error.__cause__)):
            if flow_id is None:
                return Diagnosis("transient", Treatment.RESUME, None, f"{type(error).__name__}")
            failures = self._failures.get(flow_id, 0) + 1
            self._failures[flow_id] = failures
            if failures >= MAX_FLOW_FAILURES:
                return Diagnosis(
                    "repeated_failure",
                    Treatment.KEEP,
                    flow_id,
                    f"failed {failures} times in a row: {error}",
                )
            return Diagnosis("transient", Treatment.RESUME, flow_id, str(error))
        if flow_id is not None:
            self._failures.pop(flow_id, None)
            return Diagnosis("flow_error", Treatment.FAIL, flow_id, str(error))
        return Diagnosis("unknown", Treatment.RESUME, None, f"{type(error).__name__}: {error}")

    def recovered(self) -> None:
        """A round succeeded after failures: the backoff starts again from the bottom."""
        self.consecutive = 0

    def counted(self) -> list[str]:
        """The flows with failures counted against them (not yet past the failing step)."""
        return list(self._failures)

    def forget(self, flow_id: str) -> None:
        """Stop counting a flow's failures (it was kept, or it got past the step)."""
        self._failures.pop(flow_id, None)

    def backoff_seconds(self) -> float:
        """The wait before resuming: capped exponential on the failures in a row, jittered."""
        exponent = min(max(self.consecutive - 1, 0), 20)
        base: float = min(MIN_BACKOFF_SECONDS * 2.0**exponent, MAX_BACKOFF_SECONDS)
        return base * (0.5 + self._random.random() / 2)
