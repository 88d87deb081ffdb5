"""What a caller holds of a started flow: a :class:`FlowHandle`, asking its node for the outcome."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from flows.errors import FlowStillRunningError
from statemachine.state import FlowStatus

T = TypeVar("T")


class FlowHospitalizedError(FlowStillRunningError):
    """The flow is kept in the hospital (for example, replay found it non-deterministic)."""


class FlowOutcomes(Protocol):
    """Where a handle asks about its flow (a node, or a mock node that survives restarts)."""

    def flow_status(self, flow_id: str) -> FlowStatus:
        """The flow's status."""

    def flow_result(self, flow_id: str) -> Any:
        """The flow's result (or its error raised)."""


class FlowHandle(Generic[T]):
    """A started flow: its id, and its result once it has finished."""

    def __init__(self, node: FlowOutcomes, flow_id: str) -> None:
        self._node = node
        self.flow_id = flow_id

    def done(self) -> bool:
        """True once the flow completed or failed."""
        return self._node.flow_status(self.flow_id) in (FlowStatus.COMPLETED, FlowStatus.FAILED)

    def result(self) -> T:
        """The flow's return value; raises its error if it failed, or if it has not finished."""
        return self._node.flow_result(self.flow_id)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"FlowHandle({self.flow_id})"
