"""The flow hospital: what a node does when something goes wrong, by named rules.

Errors inside flow code are the flow's: a ``FlowException`` or any other exception fails
the flow and reaches its counterparties (as itself, or as an unexpected end). What reaches
the hospital is everything else. The state machine manager pins each failure on the flow or
the inbound message that caused it whenever it can (:mod:`statemachine.manager`), and asks
:meth:`Hospital.flow_failed` or :meth:`Hospital.message_failed` what to do; the node goes on
serving every other flow meanwhile. The rules, first match wins:

``flow_error``
    Something one flow caused that is not transient (its ``in_transaction`` effect raised a
    ``ValueError``, say): that flow fails with the error, which propagates as any error in
    flow code does (its counterparties get ``UnexpectedFlowEndException``, its handle raises
    ``FlowEffectError``).
``transient``
    One flow's step met a locked, busy or disconnected database or transport (its effect
    did, say): the flow is resumed from its last checkpoint after a capped, jittered backoff
    of its own (0.1 s doubling to 30 s, 50-100 % of it), the failure counted against it.
``unexplained``
    Any other error pinned on one flow (its transaction failed, a bug in the framework for
    this flow's state) or on one message: the flow is resumed from its last checkpoint, or
    the message routed again, after the flow's or the message's own backoff, counted.
``repeated_failure``
    A flow failed ``MAX_FLOW_FAILURES`` times in a row (its count starts again once it
    commits a step): it is kept for observation (HOSPITALIZED, the reason recorded, the
    counterparties not told, messages for it held) until an operator retries or kills it.
``quarantine``
    A message failed ``MAX_MESSAGE_FAILURES`` times in a row: it is dead-lettered with the
    reason and acknowledged.
``node_wide``
    What no flow or message can be blamed for (the database or transport is down for
    everyone: ``OperationalError``, ``InterfaceError``, an invalidated connection,
    ``TransportError``, ``ConnectionError``, ``TimeoutError``; the lease was lost): the node
    process drops its memory and resumes every flow from its last checkpoint after the
    node-wide backoff (:meth:`Hospital.diagnose`), which starts again from the bottom only
    after ``RECOVERED_AFTER_SECONDS`` without such a failure, never after one good round.

Each flow's and each message's backoff is its own: it does not start again because other
flows succeed. Kept for observation without going through these rules (they are found when
a flow is loaded or replayed): ``non_determinism`` (replay found the flow asking for
something else, ``FlowNonDeterminismError``), ``untrusted_checkpoint`` (its MAC does not
match, it does not decode, or it is older than what the node committed for it),
``unrestorable_checkpoint`` (the state machine cannot restore it) and
``incompatible_checkpoint`` (the installed flows cannot resume it). Each rule has a test that
injects its error (``tests/process/test_hospital.py``, ``tests/unit/test_quarantine.py`` and
the tests named in docs/operations.md).
"""

from __future__ import annotations

import enum
import random

import attrs
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from flows.node.effects import FlowEffectError
from foundation.serialization import qualified_name
from messaging.service import TransportError
from persistence.lease import LeaseError
from statemachine.errors import AfterCommitError
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.ports import FailureAction, FailureTreatment

MAX_FLOW_FAILURES = 3
"""Failures of one flow's step, in a row, after which it is kept for observation."""
MAX_MESSAGE_FAILURES = 3
"""Failures to take in one message, in a row, after which it is quarantined."""
MIN_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 30.0
RECOVERED_AFTER_SECONDS = 60.0
"""Node-wide failures count as "in a row" unless this long passed without one."""


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


def _transient(error: BaseException) -> bool:
    """``error`` or its cause is transient (see :func:`is_transient`)."""
    return is_transient(error) or (error.__cause__ is not None and is_transient(error.__cause__))


def is_transient(error: BaseException) -> bool:
    """True for errors that go away by themselves (see the ``transient`` rule)."""
    if isinstance(error, OperationalError | InterfaceError | TransportError):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    return isinstance(error, ConnectionError | TimeoutError)


class Hospital:
    """Diagnoses errors; remembers each flow's and message's failures in a row.

    It is the manager's :class:`~statemachine.ports.FailurePolicy` for failures pinned on a
    flow or a message, and the node process's guide for node-wide ones (:meth:`diagnose`).
    """

    def __init__(self, seed: int | None = None) -> None:
        self._failures: dict[str, int] = {}
        self._message_failures: dict[str, int] = {}
        self._random = random.Random(seed)
        self.consecutive = 0
        """Node-wide failures in a row; sets the node-wide backoff."""
        self.pinned = 0
        """Failures pinned on a flow or a message so far (each handled without stopping)."""

    # --- failures pinned on a flow or a message (the manager's FailurePolicy) --------------

    def is_node_wide(self, error: Exception) -> bool:
        """True for errors no single flow or message caused (they stop the round)."""
        if isinstance(error, LeaseError | AfterCommitError):
            return True
        flow_id = error.flow_id if isinstance(error, FlowEffectError) else None
        return flow_id is None and _transient(error)

    def flow_failed(self, flow_id: str, error: Exception) -> FailureTreatment:
        """The rule for a failure of one flow's step (see the module docstring)."""
        if self.is_node_wide(error):
            return FailureTreatment(FailureAction.RAISE, str(error), "node_wide")
        self.pinned += 1
        described = f"{type(error).__name__}: {error}"
        if isinstance(error, FlowEffectError) and not _transient(error):
            self._failures.pop(flow_id, None)
            failure = FlowError(ErrorKind.INTERNAL, qualified_name(FlowEffectError), str(error))
            return FailureTreatment(FailureAction.FAIL, str(error), "flow_error", error=failure)
        failures = self._failures.get(flow_id, 0) + 1
        self._failures[flow_id] = failures
        if failures >= MAX_FLOW_FAILURES:
            self._failures.pop(flow_id, None)
            return FailureTreatment(
                FailureAction.KEEP,
                f"failed {failures} times in a row: {described}",
                "repeated_failure",
            )
        rule = "transient" if _transient(error) else "unexplained"
        return FailureTreatment(
            FailureAction.RETRY,
            f"{described}; resumed from its last checkpoint (failure {failures} of "
            f"{MAX_FLOW_FAILURES})",
            rule,
            self._backoff(failures),
        )

    def message_failed(self, key: str, error: Exception) -> FailureTreatment:
        """The rule for a failure to take in one message (see the module docstring)."""
        if self.is_node_wide(error):
            return FailureTreatment(FailureAction.RAISE, str(error), "node_wide")
        self.pinned += 1
        described = f"{type(error).__name__}: {error}"
        failures = self._message_failures.get(key, 0) + 1
        self._message_failures[key] = failures
        if failures >= MAX_MESSAGE_FAILURES:
            self._message_failures.pop(key, None)
            return FailureTreatment(
                FailureAction.QUARANTINE,
                f"taking it in failed {failures} times in a row: {described}",
                "quarantine",
            )
        return FailureTreatment(
            FailureAction.RETRY,
            f"{described}; routed again (failure {failures} of {MAX_MESSAGE_FAILURES})",
            "unexplained",
            self._backoff(failures),
        )

    def flow_recovered(self, flow_id: str) -> None:
        """The flow committed a step since it failed: its failures are forgiven."""
        self._failures.pop(flow_id, None)

    def message_recovered(self, key: str) -> None:
        """The message was taken in since it failed: its failures are forgiven."""
        self._message_failures.pop(key, None)

    def _backoff(self, failures: int) -> float:
        exponent = min(max(failures - 1, 0), 20)
        base: float = min(MIN_BACKOFF_SECONDS * 2.0**exponent, MAX_BACKOFF_SECONDS)
        return base * (0.5 + self._random.random() / 2)

    # --- node-wide failures (the node process) ----------------------------------------------

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
        return self._backoff(self.consecutive)
