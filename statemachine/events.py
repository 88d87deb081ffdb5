"""What happens to a flow: one frozen class per event kind.

Every event carries ``at``, the node clock's time when it happened, so that transitions that
need the time (deadlines) stay pure.
"""

from __future__ import annotations

from typing import Union

import attrs

from statemachine.flow_error import FlowError
from statemachine.iorequests import IORequest
from statemachine.session_messages import (
    InitialSessionMessage,
    SessionBody,
)
from statemachine.state import Checkpoint, Raised, StartedLocally, StoredFlow, Value


@attrs.frozen
class StartFlow:
    """A flow was started on this node (``node.start_flow``)."""

    flow_id: str
    origin: StartedLocally
    at: float
    session_tag: str = ""
    """The node's identity tag (see ``session_messages.identity_tag``)."""


@attrs.frozen
class StartInitiatedFlow:
    """A peer's initial session message starts the responder registered for its flow."""

    flow_id: str
    flow_class: str
    message_id: str
    sender: str
    initial: InitialSessionMessage
    flow_version: int
    app_name: str
    at: float
    session_tag: str = ""
    """The node's identity tag (see ``session_messages.identity_tag``)."""


@attrs.frozen
class RestoreFlow:
    """The node (re)started and loaded this flow's checkpoint."""

    checkpoint: Checkpoint
    at: float


@attrs.frozen
class LoadFlow:
    """The store found a flow (trusted or not, kept or not): restore it as the facts say."""

    stored: StoredFlow
    at: float


@attrs.frozen
class Suspend:
    """The flow's fiber suspended with a request."""

    request: IORequest
    at: float


@attrs.frozen
class DeliverSessionMessage:
    """A message arrived for one of the flow's sessions (already dedup-checked by id)."""

    session_id: str
    message_id: str
    sender: str
    sequence: int
    body: SessionBody
    at: float


@attrs.frozen
class WakeUp:
    """A timer the flow scheduled fired."""

    at: float


@attrs.frozen
class Hibernate:
    """The node is about to drop the waiting flow's memory: commit what it holds uncommitted.

    (Messages taken into its sessions without completing its receive, kept in memory until
    its next commit.) The flow's memory is dropped after the commit.
    """

    at: float


@attrs.frozen
class OperationEnded:
    """An attempt of the flow's external operation ``ordinal`` ended, with ``outcome``.

    ``retryable`` says whether the operation's retry policy retries the exception it raised
    (decided where the exception was); the transition decides whether an attempt is left.
    """

    ordinal: int
    attempt: int
    outcome: Value | Raised
    retryable: bool
    at: float


@attrs.frozen
class KillFlow:
    """An operator ends the flow wherever it is; its counterparties see an unexpected end."""

    reason: str
    at: float
    error: FlowError | None = None
    """The error the flow ends with (default: ``FlowKilledException`` with ``reason``)."""


@attrs.frozen
class Hospitalize:
    """Keep the flow for observation (an operator, the node's checks or its hospital)."""

    error: FlowError
    at: float


@attrs.frozen
class RetryFlow:
    """Take a kept flow out of the hospital: replay it from its stored ``checkpoint``."""

    checkpoint: Checkpoint
    at: float


@attrs.frozen
class FlowFinished:
    """``call()`` returned; ``result`` is the serialized return value."""

    result: bytes
    at: float


@attrs.frozen
class FlowFailed:
    """``call()`` raised; ``error`` describes the exception."""

    error: FlowError
    at: float
    traceback: str = ""
    """The exception's formatted traceback (empty when no flow code raised: a kill)."""


Event = Union[
    Hibernate,
    StartFlow,
    StartInitiatedFlow,
    RestoreFlow,
    LoadFlow,
    Suspend,
    DeliverSessionMessage,
    WakeUp,
    OperationEnded,
    FlowFinished,
    FlowFailed,
    KillFlow,
    Hospitalize,
    RetryFlow,
]
"""Every event kind the transition function accepts."""

CREATING_EVENTS = (StartFlow, StartInitiatedFlow, RestoreFlow, LoadFlow)
"""Events that create a flow's state rather than change an existing one."""
