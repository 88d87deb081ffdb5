"""What a transition asks the executor to do: one frozen class per action kind.

Actions come in two phases. Those marked ``IN_TRANSACTION`` are performed together inside ONE
database transaction (one per transition, or one per group of transitions); those marked
``AFTER_COMMIT`` only once that transaction has committed. This ordering is what makes
delivery exactly-once: an inbound message is acknowledged only after the transition that
consumed it is durable, and an outbound message reaches the transport only after the
checkpoint that decided to send it is durable.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Union

import attrs

from statemachine.flow_error import FlowError
from statemachine.session_facts import SessionFacts
from statemachine.session_messages import (
    InboundRecord,
    OutboundSessionMessage,
)
from statemachine.state import Checkpoint, FlowStatus


class Phase(enum.Enum):
    """When the executor performs an action."""

    IN_TRANSACTION = "in_transaction"
    AFTER_COMMIT = "after_commit"


@attrs.frozen
class PersistCheckpoint:
    """Insert or replace the flow's checkpoint row and blob."""

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    checkpoint: Checkpoint
    at: float


@attrs.frozen
class RemoveCheckpoint:
    """Delete the flow's checkpoint (it finished)."""

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    flow_id: str


@attrs.frozen
class RecordInboundMessages:
    """Insert the dedup ids of inbound messages the flow has taken in."""

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    records: tuple[InboundRecord, ...]
    at: float


@attrs.frozen
class WriteOutbox:
    """Insert outbound session messages into the outbox."""

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    messages: tuple[OutboundSessionMessage, ...]
    at: float


@attrs.frozen
class RunFlowEffects:
    """Run a flow's side effects (by ordinal) inside the transaction."""

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    flow_id: str
    ordinals: tuple[int, ...]


@attrs.frozen
class StoreFlowResult:
    """Keep a finished flow's serialized result (and the facts of its sessions)."""

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    flow_id: str
    flow_class: str
    result: bytes
    at: float
    sessions: tuple[SessionFacts, ...] = attrs.field(default=(), eq=False, repr=False)
    """The facts of the flow's sessions as it ended (its ends counted), kept with the
    result; derived from the flow's state, so not part of what the action compares by."""


@attrs.frozen
class StoreFlowError:
    """Keep a failed flow's error (and the traceback of the exception, if flow code raised)."""

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    flow_id: str
    flow_class: str
    error: FlowError
    at: float
    traceback: str = ""
    sessions: tuple[SessionFacts, ...] = attrs.field(default=(), eq=False, repr=False)
    """As :attr:`StoreFlowResult.sessions` (none for a flow that never ran)."""


@attrs.frozen
class RecordStatus:
    """Set the status (and the reason, or none) shown in a flow's checkpoint row.

    Its blob is not touched: a flow kept in the hospital keeps the checkpoint it had (for an
    untrusted one, the evidence as found).
    """

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    flow_id: str
    status: FlowStatus
    reason: str | None


@attrs.frozen
class ClaimFlowRequests:
    """Mark client requests started, in the transaction that checkpoints their flows.

    A request already started (by anyone) fails the transaction: a requested flow is created
    exactly once.
    """

    phase: ClassVar[Phase] = Phase.IN_TRANSACTION
    request_ids: tuple[str, ...]
    at: float


@attrs.frozen
class AcknowledgeMessages:
    """Tell the transport these inbound messages are done with (after commit)."""

    phase: ClassVar[Phase] = Phase.AFTER_COMMIT
    message_ids: tuple[str, ...]


@attrs.frozen
class HandOffMessages:
    """Give committed outbox messages to the transport (after commit)."""

    phase: ClassVar[Phase] = Phase.AFTER_COMMIT
    messages: tuple[OutboundSessionMessage, ...]


@attrs.frozen
class ScheduleWakeUp:
    """Arrange for a WakeUp event at ``deadline`` (after commit; durable via the checkpoint)."""

    phase: ClassVar[Phase] = Phase.AFTER_COMMIT
    flow_id: str
    deadline: float


@attrs.frozen
class StartOperation:
    """Start attempt ``attempt`` of the flow's external operation ``ordinal`` (after commit).

    ``key`` is the operation's idempotency key: the same for every attempt and every re-run
    of that step of the flow.
    """

    phase: ClassVar[Phase] = Phase.AFTER_COMMIT
    flow_id: str
    ordinal: int
    attempt: int
    key: str


Action = Union[
    PersistCheckpoint,
    RemoveCheckpoint,
    RecordInboundMessages,
    WriteOutbox,
    RunFlowEffects,
    StoreFlowResult,
    StoreFlowError,
    RecordStatus,
    ClaimFlowRequests,
    AcknowledgeMessages,
    HandOffMessages,
    ScheduleWakeUp,
    StartOperation,
]
"""Every action kind."""
