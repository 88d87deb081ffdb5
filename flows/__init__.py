"""fiberflow's user-facing API: write flows with these names.

See docs/writing-flows.md. The export list is pinned by ``tests/unit/test_exports.py``.

Importing the names flow code uses (``FlowLogic``, ``FlowSession``, the decorators, ``Party``,
the exceptions) loads no database, transport or cryptography library; ``Node``,
``NodeConfig``, ``FlowHandle`` and ``FlowHospitalizedError`` are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    OperationFailedException,
    OperationTimeoutException,
    UnexpectedFlowEndException,
    UnknownPartyError,
)
from flows.flow_logic import FOREVER, FlowLogic, FlowSession, UntrustworthyData
from flows.party import Party
from statemachine.iorequests import RetryPolicy

if TYPE_CHECKING:
    from flows.config.node import NodeConfig
    from flows.node.external_operations import OperationContext
    from flows.node.handles import FlowHandle, FlowHospitalizedError
    from flows.node.node import Node

_LAZY = {
    "FlowHandle": "flows.node.handles",
    "FlowHospitalizedError": "flows.node.handles",
    "Node": "flows.node.node",
    "NodeConfig": "flows.config.node",
    "OperationContext": "flows.node.external_operations",
}
"""Names that need the node's heavy dependencies, and the module that defines each."""


def __getattr__(name: str) -> Any:
    """Load the node's names on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flows' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily loaded ones included."""
    return sorted(set(globals()) | set(_LAZY))


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
    "OperationContext",
    "OperationFailedException",
    "OperationTimeoutException",
    "Party",
    "RetryPolicy",
    "UnexpectedFlowEndException",
    "UnknownPartyError",
    "UntrustworthyData",
    "initiated_by",
    "initiating_flow",
    "serializable",
    "startable_by_rpc",
]
