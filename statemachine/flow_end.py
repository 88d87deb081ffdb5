"""What the manager reports when a flow ends, and what it is given to start one."""

from __future__ import annotations

import attrs

from statemachine.flow_error import FlowError
from statemachine.state import FlowStatus


@attrs.frozen
class FlowEnd:
    """How a flow ended: a serialized result, or an error."""

    flow_id: str
    flow_class: str
    status: FlowStatus
    result: bytes | None = None
    error: FlowError | None = None
    traceback: str = ""
    """The formatted traceback of the exception flow code raised (empty if none did)."""


@attrs.frozen
class FlowToStart:
    """A flow to start: its id, class name, encoded arguments, and instance (or None)."""

    flow_id: str
    flow_class: str
    arguments: bytes
    instance: object = None
