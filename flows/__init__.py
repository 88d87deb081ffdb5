"""fiberflow's user-facing API: write flows with these names.

See docs/writing-flows.md. The export list is pinned by ``tests/test_exports.py``.
"""

from flows.decorators import initiated_by, initiating_flow, serializable, startable_by_rpc
from flows.errors import (
    FiberflowError,
    FlowArgumentError,
    FlowDefinitionError,
    FlowException,
    FlowFailedError,
    FlowKilledException,
    FlowNonDeterminismError,
    FlowStillRunningError,
    FlowTimeoutException,
    UnexpectedFlowEndException,
)
from flows.flow_logic import FOREVER, FlowLogic, FlowSession
from flows.node import FlowHandle, FlowHospitalizedError, Node, NodeConfig
from flows.party import Party
from flows.untrustworthy import UntrustworthyData

__all__ = [
    "FOREVER",
    "FiberflowError",
    "FlowArgumentError",
    "FlowDefinitionError",
    "FlowException",
    "FlowFailedError",
    "FlowHandle",
    "FlowHospitalizedError",
    "FlowKilledException",
    "FlowLogic",
    "FlowNonDeterminismError",
    "FlowSession",
    "FlowStillRunningError",
    "FlowTimeoutException",
    "Node",
    "NodeConfig",
    "Party",
    "UnexpectedFlowEndException",
    "UntrustworthyData",
    "initiated_by",
    "initiating_flow",
    "serializable",
    "startable_by_rpc",
]
