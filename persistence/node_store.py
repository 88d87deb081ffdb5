"""What a node store offers besides the state machine's ports: values and the control plane.

A node store has three parts. ``checkpoints`` is the state machine's ``CheckpointStore``
(:mod:`statemachine.ports`) with a few reads the node adds (outcomes, summaries);
``outbox`` is what the outbox relays read and delete (``messaging.outbox_relay.OutboxStore``);
``control`` is the operator control plane, whose contract is :class:`ControlPlane` here.

Two stores implement them: the node database (:class:`persistence.store.NodeDatabase`, SQL)
and the non-durable in-memory store (:class:`persistence.memory_store.InMemoryStore`), whose
control plane is null (:class:`persistence.memory_store.NullControlPlane`): it has no
requests and remembers nothing. ``tests/store_conformance.py`` holds both to the contracts.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

import attrs

from statemachine.flow_error import FlowError


@attrs.frozen
class CheckpointSummary:
    """One row of ``node_checkpoints``, as ``node.checkpoints()`` reports it."""

    flow_id: str
    flow_class: str
    status: str


@attrs.frozen
class StoredOutcome:
    """A finished flow's stored result or error."""

    flow_id: str
    flow_class: str
    result: bytes | None
    error: FlowError | None
    traceback: str = ""
    """The formatted traceback of the exception flow code raised (empty if none did)."""


@attrs.frozen
class FlowRequest:
    """A client's request that the node start a flow; the flow's id will be ``request_id``."""

    request_id: str
    flow_class: str
    arguments: bytes


@attrs.frozen
class PendingFlowRequest:
    """A flow request not started yet, as the node finds it."""

    request: FlowRequest
    already_a_flow: bool
    """True if a flow with the request's id exists already (a checkpoint, or an outcome):
    the node only claims such a request, it does not start the flow again."""


@attrs.frozen
class OperatorRequest:
    """An operator command queued for the node (``fiberflow flow kill`` and the like)."""

    request_id: str
    action: str
    flow_id: str | None


class ControlPlane(Protocol):
    """How clients and operators reach a running node, and what it remembers for them.

    Requests (flows to start, operator commands) are queued by one process and carried out by
    the node; paused flows and settings outlive a restart; busy-flow notes are the watchdog's.
    Writes the node makes for its flows (finishing an operator command, pausing, settings) are
    fenced by its lease; the clients' requests and the watchdog's notes are not.
    """

    def request_flows(self, requests: Sequence[FlowRequest], at: float) -> None:
        """Ask the node to start flows (one transaction; an existing request id is kept)."""

    def pending_flow_requests(self, limit: int) -> list[FlowRequest]:
        """At most ``limit`` requested flows not started yet, oldest first.

        A request is started when a transaction claims it (``claim_flow_requests``).
        """

    def flow_requests_to_start(
        self, limit: int, partitions: Collection[int] | None = None
    ) -> list[PendingFlowRequest]:
        """What :meth:`pending_flow_requests` returns, each with whether its id is a flow's.

        One query: what the node reads before it starts (or only claims) requested flows.
        With ``partitions`` (a worker of a node run by several workers), only requests for
        flows of those partitions.
        """

    def request_operation(self, action: str, flow_id: str | None, at: float) -> str:
        """Queue an operator command for the node; returns its request id."""

    def pending_operations(self) -> list[OperatorRequest]:
        """Operator commands not yet carried out, oldest first."""

    def finish_operation(self, request_id: str, outcome: str, at: float) -> None:
        """Record what an operator command did (it is no longer pending)."""

    def operation_outcome(self, request_id: str) -> str | None:
        """What an operator command did, or None while the node has not done it."""

    def set_paused(self, flow_id: str, paused: bool, at: float) -> None:
        """Remember (or forget) that ``flow_id`` is paused, across restarts."""

    def paused_flows(self) -> set[str]:
        """The flows operators paused."""

    def set_setting(self, name: str, value: str | None, at: float) -> None:
        """Store (or with None, remove) a node-wide setting, across restarts."""

    def setting(self, name: str) -> str | None:
        """A node-wide setting, or None if it is not set."""

    def note_busy_flow(self, flow_id: str, since: float, location: str) -> None:
        """Record that ``flow_id``'s code has been running since ``since`` (at ``location``)."""

    def clear_busy_flow(self, flow_id: str) -> None:
        """Forget the note of :meth:`note_busy_flow` (the flow suspended or stopped)."""

    def busy_flows(self) -> dict[str, tuple[int, str]]:
        """Flow id -> (running since, in ms; location) of the flows noted as running long."""
