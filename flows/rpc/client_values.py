"""The values :class:`~flows.rpc.client.RpcClient` answers with, read from the API's JSON.

* :class:`StartedFlow`: the answer to a start;
* :class:`FlowOutcome`: a finished flow's result or error (:meth:`FlowOutcome.value` decodes
  it as :meth:`flows.node.client.NodeClient.result` does: the error raised as the flow's node
  would raise it, its traceback chained as the cause);
* :class:`FlowEvent`: one event of a flow's progress stream, and :func:`parse_events`, which
  reads server-sent events from lines of text;
* :class:`FlowPage`: one page of ``GET /api/flows``.

Nothing here needs httpx.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from flows.errors import exception_from_error
from statemachine.flow_error import ErrorKind, FlowError

FINISHED = ("COMPLETED", "FAILED")
"""The statuses of a flow that has ended."""


@attrs.frozen
class StartedFlow:
    """A start the node accepted: ``repeated`` if the ``client_request_id`` was used before."""

    flow_id: str
    flow_class: str
    client_request_id: str | None
    repeated: bool

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> StartedFlow:
        """From the answer of ``POST /api/flows``."""
        return cls(
            document["flow_id"],
            document["class"],
            document.get("client_request_id"),
            bool(document.get("repeated", False)),
        )


@attrs.frozen
class FlowOutcome:
    """A finished flow's outcome: ``result`` (JSON, as docs/rpc.md says) or ``error``.

    ``error`` is the API's ``{"kind", "class", "message", "traceback"}``, or None when the
    flow completed.
    """

    flow_id: str
    status: str
    result: Any = None
    error: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, flow_id: str, status: str, outcome: dict[str, Any]) -> FlowOutcome:
        """From an outcome document (``GET /api/flows/{id}`` or the ``outcome`` event)."""
        return cls(flow_id, status, outcome.get("result"), outcome.get("error"))

    @property
    def failed(self) -> bool:
        """True if the flow failed."""
        return self.error is not None

    def exception(self) -> BaseException | None:
        """The flow's error as the node would raise it (traceback as its cause), or None."""
        if self.error is None:
            return None
        try:
            kind = ErrorKind(self.error.get("kind", ErrorKind.INTERNAL.value))
        except ValueError:
            kind = ErrorKind.INTERNAL
        error = FlowError(kind, self.error.get("class") or "", self.error.get("message") or "")
        return exception_from_error(error, self.error.get("traceback") or "")

    def value(self) -> Any:
        """The result, or the flow's error raised (see :meth:`exception`)."""
        exception = self.exception()
        if exception is not None:
            raise exception
        return self.result

    def error_line(self) -> str:
        """``Class: message`` of the error (the class's last part), or ``""``."""
        if self.error is None:
            return ""
        name = str(self.error.get("class") or "error").rsplit(".", 1)[-1]
        return f"{name}: {self.error.get('message') or ''}"


@attrs.frozen
class FlowEvent:
    """One event of a flow's progress stream.

    ``kind`` is ``status`` (``status`` and ``progress_step`` say where the flow is),
    ``outcome`` (the flow ended: ``outcome`` is set) or ``gone`` (it ended and the node kept
    no outcome: ``message`` says so).
    """

    kind: str
    flow_id: str
    status: str | None = None
    progress_step: str | None = None
    outcome: FlowOutcome | None = None
    message: str | None = None


def parse_events(lines: Iterable[str]) -> Iterator[FlowEvent]:
    """The events in lines of a ``text/event-stream``, as they arrive (comments skipped)."""
    kind: str | None = None
    data: list[str] = []
    for line in lines:
        if line == "":
            if kind is not None and data:
                yield _event(kind, json.loads("\n".join(data)))
            kind, data = None, []
        elif line.startswith(":"):
            continue  # a keep-alive comment
        elif line.startswith("event:"):
            kind = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].strip())
    if kind is not None and data:
        yield _event(kind, json.loads("\n".join(data)))


def _event(kind: str, data: dict[str, Any]) -> FlowEvent:
    flow_id = str(data.get("flow_id", ""))
    status = data.get("status")
    if kind == "outcome":
        outcome = FlowOutcome.from_json(flow_id, str(status), data.get("outcome") or {})
        return FlowEvent(kind, flow_id, status, None, outcome)
    if kind == "gone":
        return FlowEvent(kind, flow_id, message=data.get("error"))
    return FlowEvent(kind, flow_id, status, data.get("progress_step"))


@attrs.frozen
class FlowPage:
    """One page of flows (each a dict as ``GET /api/flows`` lists it); ``next``: the cursor."""

    flows: tuple[dict[str, Any], ...]
    next: str | None
