"""The flows a scheduler holds: each flow's runtime, which are ready, who owns each session.

A :class:`FlowRuntime` is one flow in memory: its state (the latest transition's), its fiber,
the events queued for it, the continuation its fiber waits for. :class:`FlowTable` keeps them
by flow id with the ready queue (flows with something to do this round), the paused flows
(their events wait), and the index from session id to the flow that owns it.

It also knows the *dormant* flows: flows with a stored checkpoint and nothing in memory but
their id (hibernated, or not restored yet since the node started). Their sessions need no
index: a session id names the flow that owns it (:func:`statemachine.session_ids.owner_of_session`),
so a message for a dormant flow's session is routed by waking the flow.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import attrs

from statemachine.events import Event, KillFlow
from statemachine.ports import Fiber, InboundMessage
from statemachine.result import Continuation
from statemachine.state import FlowState


@attrs.define
class FlowRuntime:
    """One flow in memory (see the module docstring)."""

    state: FlowState
    instance: object | None = None
    """The flow object a local start built (used by its first fiber, then dropped)."""
    fiber: Fiber | None = None
    events: deque[Event] = attrs.field(factory=deque)
    continuation: Continuation | None = None
    result: bytes | None = None
    traceback: str = ""
    """The traceback of the exception ``call()`` raised, if it did (the flow's end reports it)."""
    holding: bool = False
    """The flow does not run: it waits for a retry after a failure. Messages for it are
    held raw in ``held`` (unacknowledged)."""
    held: dict[tuple[str, str], InboundMessage] = attrs.field(factory=dict)
    """By (message id, sender): a redelivery replaces the copy held before."""
    retry_at: float | None = None
    """When a flow that failed is resumed from its last checkpoint (None: not waiting)."""
    indexed_sessions: int = 0
    """How many of the flow's sessions (which only ever grow, in order) are indexed."""
    flow_id: str = attrs.field(init=False)
    """The flow's id (its state's, which never changes: kept here, it is read at every step)."""

    def __attrs_post_init__(self) -> None:
        self.flow_id = self.state.flow_id

    def kill_queued(self) -> bool:
        """True if a kill waits among the flow's events."""
        return any(isinstance(event, KillFlow) for event in self.events)

    def hold(self, message: InboundMessage) -> None:
        """Hold ``message`` (unacknowledged) for the flow while it waits for its retry."""
        self.held[(message.message_id, message.sender)] = message


class FlowTable:
    """The runtimes of a scheduler's flows (see the module docstring)."""

    def __init__(self) -> None:
        self._flows: dict[str, FlowRuntime] = {}
        self._ready: deque[str] = deque()
        self._ready_set: set[str] = set()
        self._paused: set[str] = set()
        self._paused_ready: set[str] = set()
        self._session_owner: dict[str, str] = {}
        self._dormant: set[str] = set()

    def __contains__(self, flow_id: str) -> bool:
        return flow_id in self._flows

    def __iter__(self) -> Iterator[FlowRuntime]:
        return iter(self._flows.values())

    def get(self, flow_id: str) -> FlowRuntime | None:
        """The runtime of ``flow_id``, or None."""
        return self._flows.get(flow_id)

    def add(self, runtime: FlowRuntime) -> list[str]:
        """Hold ``runtime``; returns the session ids it came to own (see :meth:`index`)."""
        self._flows[runtime.flow_id] = runtime
        return self.index(runtime)

    def index(self, runtime: FlowRuntime) -> list[str]:
        """Own the flow's sessions added since it was last indexed; returns their ids.

        Sessions only ever grow, in order, so this costs O(new sessions), not O(all).
        """
        sessions = runtime.state.checkpoint.sessions
        start = runtime.indexed_sessions
        if len(sessions) == start:
            return []
        if len(sessions) < start:  # not expected (sessions only grow): index them all again
            start = 0
        owned = []
        for session in sessions[start:]:
            if session.session_id not in self._session_owner:
                self._session_owner[session.session_id] = runtime.flow_id
                owned.append(session.session_id)
        runtime.indexed_sessions = len(sessions)
        return owned

    def drop_sessions(self, runtime: FlowRuntime, sessions: Iterable[str]) -> None:
        """The flow no longer has these sessions (it continued as new): index it afresh."""
        for session_id in sessions:
            if self._session_owner.get(session_id) == runtime.flow_id:
                del self._session_owner[session_id]
        runtime.indexed_sessions = 0

    def remove(self, flow_id: str, *, forget_pause: bool) -> FlowRuntime | None:
        """Stop holding ``flow_id`` (its sessions are no longer owned; it is not ready).

        With ``forget_pause`` (the flow ended) its pause is forgotten too; otherwise (it is
        being restored) a paused flow comes back paused.
        """
        runtime = self._flows.pop(flow_id, None)
        if runtime is None:
            return None
        for session in runtime.state.checkpoint.sessions:
            if self._session_owner.get(session.session_id) == flow_id:
                del self._session_owner[session.session_id]
        self.unready(flow_id)
        if forget_pause:
            self._paused.discard(flow_id)
            self._paused_ready.discard(flow_id)
        return runtime

    def owner_of(self, session_id: str) -> str | None:
        """The flow that owns ``session_id``, or None."""
        return self._session_owner.get(session_id)

    # --- dormant flows ------------------------------------------------------------------------

    def holds(self, flow_id: str) -> bool:
        """True if the flow is in memory or dormant (see the module docstring)."""
        return flow_id in self._flows or flow_id in self._dormant

    def is_dormant(self, flow_id: str) -> bool:
        """True if the flow's checkpoint is stored and nothing else of it is in memory."""
        return flow_id in self._dormant

    def add_dormant(self, flow_id: str) -> None:
        """The flow is dormant now (it must not be in memory)."""
        assert flow_id not in self._flows, f"flow {flow_id} is in memory"
        self._dormant.add(flow_id)

    def take_dormant(self, flow_id: str) -> bool:
        """The flow stops being dormant (it is being restored); False if it was not."""
        if flow_id in self._dormant:
            self._dormant.discard(flow_id)
            return True
        return False

    def dormant_ids(self) -> list[str]:
        """The dormant flows' ids (a copy)."""
        return list(self._dormant)

    def dormant_count(self) -> int:
        """How many flows are dormant."""
        return len(self._dormant)

    # --- readiness ----------------------------------------------------------------------------

    def queue_event(self, flow_id: str, event: Event) -> None:
        """Queue ``event`` for the flow and make it ready."""
        self._flows[flow_id].events.append(event)
        self.mark_ready(flow_id)

    def mark_ready(self, flow_id: str) -> None:
        """The flow has something to do (a paused flow's readiness waits for its resume)."""
        if flow_id in self._paused:
            self._paused_ready.add(flow_id)
            return
        if flow_id not in self._ready_set:
            self._ready_set.add(flow_id)
            self._ready.append(flow_id)

    def unready(self, flow_id: str) -> None:
        """The flow has nothing to do this round (after all)."""
        if flow_id in self._ready_set:
            self._ready_set.discard(flow_id)
            self._ready.remove(flow_id)

    def pop_ready(self) -> str | None:
        """The next ready flow's id (taken off the queue), or None."""
        if not self._ready:
            return None
        flow_id = self._ready.popleft()
        self._ready_set.discard(flow_id)
        return flow_id

    def is_ready(self, flow_id: str) -> bool:
        """True if the flow is queued to run this round (or waits for its resume to be)."""
        return flow_id in self._ready_set or flow_id in self._paused_ready

    def has_ready(self) -> bool:
        """True if some flow is ready."""
        return bool(self._ready)

    # --- pausing ------------------------------------------------------------------------------

    def pause(self, flow_id: str) -> None:
        """Hold the flow's readiness until :meth:`resume`."""
        self._paused.add(flow_id)
        if flow_id in self._ready_set:
            self.unready(flow_id)
            self._paused_ready.add(flow_id)

    def resume(self, flow_id: str) -> None:
        """Let a paused flow run again (ready at once if something waited)."""
        self._paused.discard(flow_id)
        if flow_id in self._paused_ready:
            self._paused_ready.discard(flow_id)
            self.mark_ready(flow_id)

    def unpause(self, flow_id: str) -> None:
        """Forget a pause without making the flow ready (a kill goes ahead of it)."""
        self._paused.discard(flow_id)
        self._paused_ready.discard(flow_id)

    def is_paused(self, flow_id: str) -> bool:
        """True while the flow is paused."""
        return flow_id in self._paused

    def paused(self) -> set[str]:
        """The paused flows."""
        return set(self._paused)
