"""Flows that clients asked for through the database, started exactly once.

A client (``fiberflow flow start``, :mod:`flows.node.client`) writes a row to
``node_flow_requests``; the node process calls :meth:`FlowRequestIntake.start_pending` in
its loop. Each request is claimed in the transaction that commits its flow's first
checkpoint, or its refusal, so a request is started exactly once. The flow id is the
request id: a request whose id is already a flow's is only claimed.

A batch of requests costs two statements whatever its size: one query finds the pending
requests and, for each, whether its id is a flow's already
(``ControlPlane.flow_requests_to_start``); one update in the transaction that starts them
claims them all.

:func:`encode_arguments` serializes a flow's constructor arguments for a request (or a local
start), naming the first argument that cannot be checkpointed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from flows.cordapps import Cordapps
from flows.flow_logic import FlowLogic
from flows.flow_logic import encode_arguments as encode_flow_arguments
from flows.markings import responder_initiator
from flows.party import Party
from foundation.serialization import PAYLOADS, Serializer
from persistence.node_store import ControlPlane, FlowRequest
from statemachine.actions import ClaimFlowRequests, StoreFlowError
from statemachine.flow_end import FlowToStart
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.manager import StateMachineManager
from statemachine.ports import Clock, FailurePolicy

log = logging.getLogger("fiberflow.node")

_FAILED = "flows.errors.FlowFailedError"
_MAX_REASON = 8192


class FlowRequestIntake:
    """Starts the flows waiting in the control plane (see the module docstring)."""

    def __init__(
        self,
        *,
        party: Party,
        control: ControlPlane,
        manager: StateMachineManager,
        cordapps: Cordapps,
        clock: Clock,
        hospital: FailurePolicy | None,
    ) -> None:
        """Take requests from ``control`` and start them through ``manager``.

        With a ``hospital``, a batch that fails for a reason pinned on one request is
        started again one request per transaction, and the requests that still fail are
        refused (recorded as failed flows); without one the error propagates.
        """
        self._party = party
        self._control = control
        self._manager = manager
        self._cordapps = cordapps
        self._clock = clock
        self._hospital = hospital

    def start_pending(self, limit: int = 500, partitions: Collection[int] | None = None) -> int:
        """Start up to ``limit`` requested flows; returns how many were started.

        With ``partitions`` (a worker of a node run by several workers), only requests for
        flows of those partitions (the flow id is the request id).
        """
        pending = self._control.flow_requests_to_start(limit, partitions)
        if not pending:
            return 0
        ids = [p.request.request_id for p in pending]
        to_start: list[FlowToStart] = []
        refused: list[StoreFlowError] = []
        for found in pending:
            request = found.request
            if found.already_a_flow or self._manager.holds(request.request_id):
                continue
            reason = self._refusal(request)
            if reason is not None:
                log.error("refusing flow request %s: %s", request.request_id, reason)
                refused.append(self._refused(request.request_id, request.flow_class, reason))
                continue
            to_start.append(
                FlowToStart(request.request_id, request.flow_class, request.arguments, None)
            )
        claim = ClaimFlowRequests(tuple(ids), self._clock.now())
        try:
            self._manager.start_flows(to_start, also=(*refused, claim))
        except Exception as error:
            if self._hospital is None or self._hospital.is_node_wide(error) or len(ids) == 1:
                raise
            # One request per transaction, to find the ones that cannot be started.
            return self._start_one_by_one(to_start, refused, error)
        return len(to_start)

    def _refusal(self, request: FlowRequest) -> str | None:
        """Why ``request`` cannot be started now, or None."""
        if self._manager.draining:
            return f"node {self._party} is draining: it starts no new flows"
        cls = self._cordapps.flow_class(request.flow_class)
        if cls is None:
            return f"{request.flow_class} is not a flow in this node's CorDapps"
        initiator = responder_initiator(cls)
        if initiator is not None:
            return (
                f"{request.flow_class} is a responder (@initiated_by {initiator.__qualname__}): "
                "its node starts it when a peer opens a session; it cannot be requested"
            )
        return None

    def _refused(self, flow_id: str, flow_class: str, reason: str) -> StoreFlowError:
        """The failed-flow record of a refused request."""
        error = FlowError(ErrorKind.INTERNAL, _FAILED, reason[:_MAX_REASON])
        return StoreFlowError(flow_id, flow_class, error, self._clock.now())

    def _start_one_by_one(
        self, to_start: list[FlowToStart], refused: list[StoreFlowError], error: Exception
    ) -> int:
        """Start each request in its own transaction; refuse those that fail (pinned)."""
        assert self._hospital is not None
        log.warning(
            "%s: starting %d requested flows failed (%s); one by one now",
            self._party,
            len(to_start),
            error,
        )
        started = 0
        for flow in to_start:
            at = self._clock.now()
            try:
                self._manager.start_flows([flow], also=(ClaimFlowRequests((flow.flow_id,), at),))
                started += 1
                continue
            except Exception as failure:
                if self._hospital.is_node_wide(failure):
                    raise
                reason = f"could not be started: {type(failure).__name__}: {failure}"
            log.error("refusing flow request %s: %s", flow.flow_id, reason)
            refusal = self._refused(flow.flow_id, flow.flow_class, reason)
            self._manager.start_flows([], also=(refusal, ClaimFlowRequests((flow.flow_id,), at)))
        for refusal in refused:
            claim = ClaimFlowRequests((refusal.flow_id,), self._clock.now())
            self._manager.start_flows([], also=(refusal, claim))
        return started


def encode_arguments(flow: FlowLogic[Any], payloads: Serializer = PAYLOADS) -> bytes:
    """Serialize a flow's constructor arguments (see :func:`flows.flow_logic.encode_arguments`)."""
    return encode_flow_arguments(flow, payloads)
