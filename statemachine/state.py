"""Immutable flow state: the checkpoint (what survives a crash) and the in-memory extras.

Greenlets cannot be serialized, so a :class:`Checkpoint` records *what happened*: how the
flow was started, the journal of completed requests with their outcomes, the sessions (with
buffered, unconsumed messages) and the request the flow is blocked on, if any. Restoring a
flow re-runs its ``call()`` and answers each request from the journal.

:class:`FlowState` adds what only matters between two commits: the replay cursor, the inbound
messages accepted but not yet recorded, and the outbound messages decided but not yet written
to the outbox. All of it is frozen; transitions build new values with ``attrs.evolve``.
The sequences that grow with a flow (sessions, journal, messages since the last commit) are
persistent vectors (pyrsistent's, see :mod:`statemachine.immutable`), so one step costs
O(log n) however many sessions the flow has.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Union

import attrs
from pyrsistent import PVector

from statemachine.flow_error import FlowError
from statemachine.immutable import replace, vector_of
from statemachine.iorequests import Plain, Receive, RunOperation, Sleep
from statemachine.session_messages import (
    InboundRecord,
    OutboundSessionMessage,
    SessionBody,
    SessionData,
    SessionEnd,
    SessionErrorBody,
    SessionReject,
)
from statemachine.session_table import SessionTable


class FlowStatus(enum.Enum):
    """Where a flow is in its life. Only the first five are ever stored in a checkpoint row."""

    UNSTARTED = "UNSTARTED"
    """Created, ``call()`` not yet begun."""
    RUNNABLE = "RUNNABLE"
    """Running, or about to be resumed."""
    SUSPENDED = "SUSPENDED"
    """Waiting for messages or a wake-up (see ``Checkpoint.pending``)."""
    REPLAYING = "REPLAYING"
    """Restored from a checkpoint and re-running ``call()`` against the journal."""
    HOSPITALIZED = "HOSPITALIZED"
    """Kept for an operator: replay diverged, or the flow cannot go on safely."""
    COMPLETED = "COMPLETED"
    """Finished with a result."""
    FAILED = "FAILED"
    """Finished with an error."""


@attrs.frozen
class StartedLocally:
    """The flow was started on this node with the serialized constructor arguments."""

    flow_class: str
    arguments: bytes
    generation: int = attrs.field(default=0, metadata={"fiberflow.omit_default": True})
    """How many times the flow continued as new (``FlowLogic.continue_as_new``); left out of
    a format-1 checkpoint blob while 0, so blobs of flows that never did are unchanged."""


@attrs.frozen
class InitiatedBy:
    """The flow was started by a peer's initial message on ``session_id``."""

    flow_class: str
    session_id: str
    counterparty: str
    counterparty_flow_version: int = 1
    """The initiating flow's ``@initiating_flow(version=...)`` on the peer."""
    counterparty_app_name: str = ""
    """The CorDapp (top-level package) the initiating flow came from."""


FlowOrigin = Union[StartedLocally, InitiatedBy]
"""How a flow came to exist: what replay needs to construct it again."""


@attrs.frozen
class Value:
    """A request completed with a value."""

    value: Plain


@attrs.frozen
class Raised:
    """A request completed by raising ``error`` in the flow."""

    error: FlowError


NO_VALUE = Value(None)
"""The outcome of a request that returns nothing (shared: values are immutable)."""

Outcome = Union[Value, Raised]
"""How a request completed."""


@attrs.frozen
class JournalEntry:
    """One completed request: its signature (for determinism checks) and its outcome."""

    signature: tuple[Plain, ...]
    outcome: Outcome


InboxItem = Union[SessionData, SessionEnd, SessionErrorBody, SessionReject]
"""A message that waits in a session's inbox for the flow to receive it."""


@attrs.frozen
class EarlyMessage:
    """A message that arrived ahead of its turn (a lower sequence number is still missing)."""

    sequence: int
    body: SessionBody


@attrs.frozen(weakref_slot=False)  # see statemachine.immutable
class SessionState:
    """One session as seen from our flow."""

    session_id: str
    peer_session_id: str
    counterparty: str
    initiated_by_us: bool
    initiating_flow: str
    flow_version: int
    app_name: str
    initial_sent: bool = False
    confirmed: bool = False
    peer_flow_version: int | None = None
    peer_app_name: str | None = None
    closed_by_us: bool = False
    next_send_sequence: int = 0
    next_receive_sequence: int = 0
    inbox: tuple[InboxItem, ...] = ()
    early: tuple[EarlyMessage, ...] = ()

    def terminal_item(self) -> InboxItem | None:
        """The end, error or reject message at the head of the inbox, if that is what's next."""
        if self.inbox and not isinstance(self.inbox[0], SessionData):
            return self.inbox[0]
        return None

    def peer_finished(self) -> bool:
        """True once an end, error or reject from the peer has arrived (in order)."""
        return any(not isinstance(item, SessionData) for item in self.inbox)


PendingRequest = Union[Receive, Sleep, RunOperation]
"""A request the flow is blocked on."""


@attrs.frozen
class Pending:
    """The request a suspended flow waits for, and its durable deadline if it has one."""

    request: PendingRequest
    deadline: float | None = None


def _session_table(sessions: Iterable[SessionState]) -> SessionTable[SessionState]:
    return SessionTable.of(sessions)


def _journal(entries: Iterable[JournalEntry]) -> PVector[JournalEntry]:
    return vector_of(entries)


@attrs.frozen(weakref_slot=False)  # see statemachine.immutable
class Checkpoint:
    """Everything about a flow that must survive a crash.

    ``sessions`` and ``journal`` accept any iterable and are kept as persistent sequences
    (:class:`~statemachine.session_table.SessionTable`, a pyrsistent ``PVector``): one
    session or entry changes in O(log n) and the rest is shared with the previous value.
    Both are stored as the tuples of their items; the table also compares equal to that
    tuple, the journal to the list of its items (``tuple(journal)`` to compare with a tuple).
    """

    flow_id: str
    origin: FlowOrigin
    status: FlowStatus
    created_at: float
    sessions: SessionTable[SessionState] = attrs.field(default=(), converter=_session_table)
    journal: PVector[JournalEntry] = attrs.field(default=(), converter=_journal)
    pending: Pending | None = None
    next_session_index: int = 0
    error: FlowError | None = None
    progress_step: str | None = None
    """The step the flow last reported (``FlowLogic.progress``), for operators."""
    session_tag: str = ""
    """This node's identity tag, put in front of the ids of sessions the flow opens."""
    version: int = 0
    """How many times this flow's checkpoint has been committed (this is the ``version``-th).

    The store binds it into the checkpoint's MAC and its row, so that an older checkpoint put
    back in place of the newest is refused (see docs/security.md)."""

    @property
    def flow_class(self) -> str:
        """Qualified name of the flow's class."""
        return self.origin.flow_class

    def session(self, session_id: str) -> SessionState | None:
        """The session with this id, or None (O(log n))."""
        return self.sessions.get(session_id)

    def with_session(self, updated: SessionState) -> Checkpoint:
        """A copy with ``updated`` replacing the session of the same id (or appended)."""
        return replace(self, sessions=self.sessions.put(updated))

    def with_sessions(self, updated: Iterable[SessionState]) -> Checkpoint:
        """A copy with each of ``updated`` put in as by :meth:`with_session`, built once."""
        return replace(self, sessions=self.sessions.put_many(updated))


@attrs.frozen(weakref_slot=False)  # see statemachine.immutable
class ReceiveProgress:
    """How far a flow suspended on a receive has got: derived, never stored.

    Sessions ``request.session_ids[:ready]`` have a message waiting; ``members`` are the
    request's session ids as a set. While the flow waits, inboxes only grow, so ``ready``
    only moves forward: a message costs O(1) plus the sessions it lets ``ready`` pass, and a
    receive on n sessions costs O(n) in all, not O(n) per message.
    """

    request: Receive
    members: frozenset[str]
    ready: int


def _records(records: Iterable[InboundRecord]) -> PVector[InboundRecord]:
    return vector_of(records)


def _outbound(messages: Iterable[OutboundSessionMessage]) -> PVector[OutboundSessionMessage]:
    return vector_of(messages)


def _ordinals(ordinals: Iterable[int]) -> PVector[int]:
    return vector_of(ordinals)


@attrs.frozen
class StoredFlow:
    """What the store found for one flow: facts, for the transition to decide on.

    ``checkpoint`` is the flow's checkpoint if it could be trusted; otherwise it is None and
    ``problem`` says why (its MAC does not match, it does not decode, it is older than what
    the node committed). ``row_status`` and ``row_reason`` are what the flow's row shows (an
    operator or the node may have kept the flow in the hospital).
    """

    flow_id: str
    flow_class: str
    created_at: float
    row_status: FlowStatus
    row_reason: str | None
    checkpoint: Checkpoint | None
    problem: str | None = None

    @classmethod
    def trusted(cls, checkpoint: Checkpoint, row_reason: str | None = None) -> StoredFlow:
        """The facts of a checkpoint read back as it was written (its row shows its status)."""
        return cls(
            checkpoint.flow_id,
            checkpoint.flow_class,
            checkpoint.created_at,
            checkpoint.status,
            row_reason,
            checkpoint,
        )


@attrs.frozen
class IndexEntry:
    """What a node loads of a stored flow at start, instead of the flow (lazy restore).

    From the flow's row, not its blob: a hint for when to restore the flow, never trusted
    for anything else (the blob, checked when the flow is restored, decides). ``waiting`` is
    True if the row says the flow is suspended on a receive or a sleep, so it needs nothing
    until a message or its ``wake_at`` (epoch seconds, None: no deadline) comes.
    """

    flow_id: str
    waiting: bool
    wake_at: float | None


@attrs.frozen(weakref_slot=False)  # see statemachine.immutable
class FlowState:
    """A checkpoint plus what happened since it was last committed."""

    checkpoint: Checkpoint
    replay_cursor: int = 0
    unrecorded_inbound: PVector[InboundRecord] = attrs.field(default=(), converter=_records)
    unsent_outbound: PVector[OutboundSessionMessage] = attrs.field(default=(), converter=_outbound)
    unrun_effects: PVector[int] = attrs.field(default=(), converter=_ordinals)
    """Ordinals of side effects asked for since the last commit (run in its transaction)."""
    uncommitted_steps: int = 0
    receive_progress: ReceiveProgress | None = None
    """Set while the flow is suspended on a receive (see :class:`ReceiveProgress`)."""

    @property
    def flow_id(self) -> str:
        """The flow's id."""
        return self.checkpoint.flow_id

    @property
    def status(self) -> FlowStatus:
        """The flow's status."""
        return self.checkpoint.status

    def is_dirty(self) -> bool:
        """True if anything happened since the last commit that a commit would record."""
        return bool(
            self.uncommitted_steps
            or self.unrecorded_inbound
            or self.unsent_outbound
            or self.unrun_effects
        )
