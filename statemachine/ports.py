"""The protocols through which the executor and the manager reach the outside world.

The state machine package never imports a database driver, a transport or greenlet: the node
(:mod:`flows.node.node`) plugs implementations of these protocols in. Each protocol states its
contract in its docstring; the conformance tests hold every implementation to it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol, Union

import attrs

from statemachine.actions import (
    ClaimFlowRequests,
    PersistCheckpoint,
    RecordInboundMessages,
    RecordStatus,
    RemoveCheckpoint,
    RunFlowEffects,
    StartOperation,
    StoreFlowError,
    StoreFlowResult,
)
from statemachine.flow_error import FlowError
from statemachine.iorequests import IORequest, Plain
from statemachine.session_messages import SessionMessage
from statemachine.state import FlowOrigin, IndexEntry, Raised, StoredFlow, Value


@attrs.frozen
class OutboxRow:
    """An outbound message as the outbox stores it and the transport carries it."""

    message_id: str
    target: str
    data: bytes


@attrs.frozen
class InboundMessage:
    """A message the transport delivered; each delivery is acknowledged once done with."""

    message_id: str
    sender: str
    data: bytes
    rejection: str | None = None
    """Set when the node refused the message before routing (a bad tag, say)."""
    delivery: object = attrs.field(default=None, eq=False, repr=False)
    """The transport's handle for this one delivery (what acknowledging settles)."""


class StoreTransaction(Protocol):
    """One open database transaction. Nothing written is visible until :meth:`commit`."""

    def put_checkpoints(self, actions: Sequence[PersistCheckpoint]) -> None:
        """Insert or replace each checkpoint (row and blob); for one flow the last one wins."""

    def remove_checkpoints(self, actions: Sequence[RemoveCheckpoint]) -> None:
        """Delete these flows' checkpoints where there are any."""

    def record_inbound(self, actions: Sequence[RecordInboundMessages]) -> None:
        """Insert dedup ids; an id already present is an error (it would be consumed twice)."""

    def write_outbox(self, rows: Sequence[tuple[OutboxRow, float]]) -> None:
        """Insert encoded outbound messages, each with the time it was decided."""

    def store_results(self, actions: Sequence[StoreFlowResult]) -> None:
        """Keep the serialized results of finished flows."""

    def store_errors(self, actions: Sequence[StoreFlowError]) -> None:
        """Keep the errors of failed flows."""

    def record_statuses(self, actions: Sequence[RecordStatus]) -> None:
        """Set the status and reason shown in these flows' rows (their blobs untouched)."""

    def claim_flow_requests(self, actions: Sequence[ClaimFlowRequests]) -> None:
        """Mark client flow requests started; fail if any was started before."""

    @property
    def handle(self) -> object:
        """What flow side effects get to write with (a SQLAlchemy Connection, or None)."""

    def commit(self) -> None:
        """Make everything written durable, atomically."""

    def rollback(self) -> None:
        """Discard everything written."""


class FlowEffects(Protocol):
    """Runs the side effects flows asked for (``FlowLogic.in_transaction``)."""

    def run(self, actions: Sequence[RunFlowEffects], transaction: StoreTransaction) -> None:
        """Run each action's effects, in order, inside ``transaction``."""

    def committed(self, actions: Sequence[RunFlowEffects]) -> None:
        """The transaction that ran ``actions`` committed: forget their effects."""


@attrs.frozen
class EndedAttempt:
    """An attempt of a flow's external operation ended (what the runner hands back)."""

    flow_id: str
    ordinal: int
    attempt: int
    outcome: Value | Raised
    """The serialized result as a value, or the failure."""
    retryable: bool
    """Whether the operation's retry policy retries the exception it raised."""


class OperationRunner(Protocol):
    """Runs flows' external operations off the scheduler (``FlowLogic.call_external``).

    :meth:`start` must not block: attempts run elsewhere (threads, an event loop) and their
    ends are collected by :meth:`take_ended`, which the manager calls every round.
    """

    def start(self, actions: Sequence[StartOperation]) -> None:
        """Start each attempt (after the commit that made it durable)."""

    def abandon(self, flow_id: str) -> None:
        """The flow is gone from this node (ended, killed, restored): drop its attempts."""

    def take_ended(self) -> list[EndedAttempt]:
        """The attempts that ended since the last call, taken off."""


class CheckpointStore(Protocol):
    """The node database, as the state machine needs it."""

    def begin(self) -> StoreTransaction:
        """Open a transaction."""

    def is_consumed(self, message_id: str) -> bool:
        """True if an inbound message with this id was recorded (committed) before."""

    def consumed_among(self, message_ids: Sequence[str]) -> set[str]:
        """The ids among ``message_ids`` that were recorded (committed) before."""

    def load_checkpoints(self, flow_ids: Sequence[str] | None = None) -> list[StoredFlow]:
        """What is stored of every flow (of ``flow_ids``), oldest first.

        Facts, checked (MAC, freshness) but not acted on: the transition decides
        (:class:`~statemachine.events.LoadFlow`).
        """

    def checkpoint_index(self) -> list[IndexEntry]:
        """An entry per stored checkpoint, oldest first, read from rows only (no blobs)."""

    def load_checkpoint(self, flow_id: str) -> StoredFlow | None:
        """What is stored of one flow (see :meth:`load_checkpoints`), or None."""

    def check_lease(self) -> None:
        """Raise if the node no longer holds its lease.

        A fenced transaction that writes nothing; the manager calls it before settling
        messages it dropped.
        """

    def dead_letter(self, message: InboundMessage, reason: str, at: float) -> None:
        """Keep a message that cannot be processed, with the reason, in its own transaction."""


class FailureAction(enum.Enum):
    """What the node does about a failure pinned on one flow or one inbound message."""

    RETRY = "retry"
    """Resume the flow from its last checkpoint (or route the message again) after a delay."""
    KEEP = "keep"
    """Keep the flow in the hospital (it does not run; messages for it are held)."""
    FAIL = "fail"
    """End the flow with the error, as if its code had raised it."""
    QUARANTINE = "quarantine"
    """Dead-letter the message with the reason and acknowledge it."""
    RAISE = "raise"
    """Not this flow's or message's doing (the database is down, the lease is lost): the
    error propagates to the node."""


@attrs.frozen
class FailureTreatment:
    """The action for a pinned failure, when (``delay`` seconds from now) and why."""

    action: FailureAction
    reason: str
    rule: str
    delay: float = 0.0
    error: FlowError | None = None
    """For FAIL: the error the flow ends with."""


class FailurePolicy(Protocol):
    """Decides what to do about failures the manager pins on a flow or a message.

    The node's flow hospital (:mod:`flows.node.hospital`) implements it. Without a policy the
    manager lets every error propagate (the test harness's default: a test sees the bug).
    """

    def is_node_wide(self, error: Exception) -> bool:
        """True if ``error`` is no single flow's or message's doing (it must propagate)."""

    def flow_failed(self, flow_id: str, error: Exception) -> FailureTreatment:
        """A step of ``flow_id`` failed with ``error`` (counted against the flow)."""

    def message_failed(self, key: str, error: Exception) -> FailureTreatment:
        """Taking in the inbound message ``key`` failed with ``error`` (counted against it)."""

    def flow_recovered(self, flow_id: str) -> None:
        """``flow_id`` committed a step after failing: its failures are forgiven."""

    def message_recovered(self, key: str) -> None:
        """The message ``key`` was taken in after failing: its failures are forgiven."""

    def counted(self) -> list[str]:
        """The flows with failures counted against them (across the node's managers)."""


class MessageCodec(Protocol):
    """Session messages to bytes and back (the node's :class:`messaging.codec.SessionCodec`)."""

    def encode(self, message: SessionMessage) -> bytes:
        """The bytes ``message`` travels and is stored in the outbox as."""

    def decode(self, data: bytes) -> SessionMessage:
        """The message in bytes from a peer; raises an error naming what is wrong with them.

        A decoded message satisfies its class's field rules (it was validated).
        """


class Outbound(Protocol):
    """Hands committed outbox rows to the transport (the outbox relay)."""

    def hand_off(self, rows: Sequence[OutboxRow]) -> None:
        """Send the rows; each is deleted from the outbox once the transport durably has it."""


@attrs.frozen
class Suspended:
    """The fiber suspended with a request."""

    request: IORequest


@attrs.frozen
class Returned:
    """``call()`` returned; the result is serialized."""

    result: bytes


@attrs.frozen
class Failed:
    """``call()`` raised (or the flow could not be constructed)."""

    error: FlowError
    traceback: str = ""
    """The exception's formatted traceback, bounded (kept on the node, never sent)."""


FiberOutcome = Union[Suspended, Returned, Failed]
"""Where a fiber stopped when control came back to the scheduler."""


class Fiber(Protocol):
    """A flow's ``call()`` running as a coroutine that the scheduler steps."""

    def resume(self, value: Plain) -> FiberOutcome:
        """Start the fiber (first call) or resume it with the value of its request."""

    def throw(self, error: FlowError) -> FiberOutcome:
        """Resume the fiber by raising ``error`` at its suspension point."""

    def abort(self) -> None:
        """Discard the fiber without running any more flow code."""


class FiberFactory(Protocol):
    """Creates fibers for flows."""

    def create(self, flow_id: str, origin: FlowOrigin, instance: object | None) -> Fiber:
        """A fiber for the flow; ``instance`` is the already constructed flow, if there is one."""


@attrs.frozen
class Responder:
    """The flow a node starts when a peer initiates a session from a given flow class."""

    flow_class: str
    flow_version: int
    app_name: str


class ResponderRegistry(Protocol):
    """Which responder flow, if any, answers an initiating flow class."""

    def responder_for(self, initiator_class: str) -> Responder | None:
        """The responder registered for ``initiator_class``, or None."""


class Clock(Protocol):
    """The node's clock: seconds since the epoch."""

    def now(self) -> float:
        """The current time."""
