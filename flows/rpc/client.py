"""``RpcClient``: start, watch and operate flows through a node's HTTP API.

The shape of :class:`flows.node.client.NodeClient` (``start_flow(s)``, ``wait`` with an
``on_progress`` callback, ``result``, ``outcomes``), over HTTP with a user of the node's
``[rpc]`` section instead of the node database's rights, plus what the API adds: starts by
class name, status, paged lists, the progress stream, operations and the node's state.

It needs only httpx (``pip install 'fiberflow[client]'``), not the server's Starlette,
uvicorn or argon2. Refusals raise :mod:`flows.rpc.client_errors`. See docs/rpc.md.
"""

from __future__ import annotations

import inspect
import os
import ssl
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from flows.errors import FlowStillRunningError
from flows.flow_logic import FlowLogic
from flows.node.client import FlowWaitTimeoutError, wait_for_outcomes
from flows.rpc.client_errors import RpcConnectionError, RpcError, error_for_status
from flows.rpc.client_values import (
    FINISHED,
    FlowEvent,
    FlowOutcome,
    FlowPage,
    StartedFlow,
    parse_events,
)
from flows.rpc.outcomes import json_value
from foundation.serialization import qualified_name

STREAM_READ_SECONDS = 60.0
"""How long the progress stream may stay silent (the node sends a comment every 15 s)."""


class RpcClient:
    """A client of one node's HTTP API, as one of its ``[rpc]`` users."""

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        verify: str | os.PathLike[str] | ssl.SSLContext | bool = True,
        timeout: float = 60.0,
    ) -> None:
        """Talk to the API at ``url`` (``http://127.0.0.1:8080``, ``https://...``).

        Log in as ``user`` with ``password`` (HTTP Basic) or with an API ``token``; with
        neither, only :meth:`health` and :meth:`ready` answer. ``verify`` is a CA file (PEM)
        or an :class:`ssl.SSLContext` to trust for HTTPS (default: the system's roots).
        ``timeout`` bounds each request, in seconds.
        """
        if token is not None and (user is not None or password is not None):
            raise ValueError("give user and password, or a token, not both")
        if (user is None) != (password is None):
            raise ValueError("a user needs its password (and a password its user)")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the API's URL must start with http:// or https://, not {url!r}")
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        auth = (
            httpx.BasicAuth(user, password) if user is not None and password is not None else None
        )
        if isinstance(verify, str | os.PathLike):
            path = Path(verify)
            if not path.is_file():
                raise ValueError(f"CA file {str(path)!r} does not exist")
            verify = ssl.create_default_context(cafile=str(path))
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.url, auth=auth, headers=headers, verify=verify, timeout=timeout
        )

    # --- starting flows ---------------------------------------------------------------------

    def start(
        self, flow_class: str, /, client_request_id: str | None = None, **arguments: Any
    ) -> StartedFlow:
        """Ask the node to start ``flow_class`` (qualified name) with these arguments.

        Arguments are JSON values as docs/rpc.md says (a ``Party`` may be given as itself or
        as its X.500 name). With ``client_request_id`` the start is idempotent: asking again
        answers the same flow (``repeated``).
        """
        body: dict[str, Any] = {"class": flow_class, "args": json_value(arguments)}
        if client_request_id is not None:
            body["client_request_id"] = client_request_id
        return StartedFlow.from_json(self._json("POST", "/api/flows", json=body))

    def start_flow(self, flow: FlowLogic[Any] | str, request_id: str | None = None) -> str:
        """Start a flow described by a ``FlowLogic`` instance; returns its flow id.

        As :meth:`flows.node.client.NodeClient.start_flow`: the instance only describes the
        start (its class and constructor arguments, sent by name); ``request_id`` is the
        client request id (default: a new one, so each call starts a flow).
        """
        return self.start_flows([flow], [request_id or uuid.uuid4().hex])[0]

    def start_flows(
        self, flows: Sequence[FlowLogic[Any] | str], request_ids: Sequence[str] | None = None
    ) -> list[str]:
        """Start several flows (one request each); returns their flow ids."""
        ids = list(request_ids) if request_ids is not None else [uuid.uuid4().hex for _ in flows]
        if len(ids) != len(flows):
            raise ValueError(f"{len(flows)} flows but {len(ids)} request ids")
        started = []
        for flow, request_id in zip(flows, ids, strict=True):
            if isinstance(flow, str):
                started.append(self.start(flow, client_request_id=request_id))
                continue
            if not isinstance(flow, FlowLogic):
                raise TypeError(f"start_flow needs a FlowLogic instance, not {type(flow)}")
            arguments = flow_arguments(flow)
            started.append(
                self.start(qualified_name(type(flow)), client_request_id=request_id, **arguments)
            )
        return [s.flow_id for s in started]

    # --- reading flows ----------------------------------------------------------------------

    def status(self, flow_id: str) -> dict[str, Any]:
        """The flow's document (``GET /api/flows/{id}``: status, step, sessions, outcome)."""
        document: dict[str, Any] = self._json("GET", f"/api/flows/{_path(flow_id)}")
        return document

    def page(
        self,
        *,
        status: Sequence[str] | str | None = None,
        flow_class: str | None = None,
        min_age: float | None = None,
        max_age: float | None = None,
        finished: bool = False,
        limit: int = 100,
        after: str | None = None,
    ) -> FlowPage:
        """One page of flows (``GET /api/flows`` with these filters; ``after``: a cursor)."""
        params: dict[str, str] = {"limit": str(limit)}
        if status:
            params["status"] = status if isinstance(status, str) else ",".join(status)
        if flow_class:
            params["class"] = flow_class
        if min_age is not None:
            params["min_age"] = repr(float(min_age))
        if max_age is not None:
            params["max_age"] = repr(float(max_age))
        if finished:
            params["finished"] = "true"
        if after:
            params["after"] = after
        document = self._json("GET", "/api/flows", params=params)
        return FlowPage(tuple(document["flows"]), document.get("next"))

    def pages(self, **filters: Any) -> Iterator[FlowPage]:
        """Every page of flows, following the cursor (``filters`` as :meth:`page` takes)."""
        after = filters.pop("after", None)
        while True:
            page = self.page(after=after, **filters)
            yield page
            if page.next is None:
                return
            after = page.next

    def list(self, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every flow matching ``filters`` (as :meth:`page` takes), page after page."""
        for page in self.pages(**filters):
            yield from page.flows

    def outcomes(self, flow_ids: Sequence[str]) -> dict[str, FlowOutcome]:
        """The outcomes of those flows that have finished (an unknown flow: RpcNotFoundError)."""
        found = {}
        for flow_id in flow_ids:
            document = self.status(flow_id)
            if document["status"] in FINISHED and document.get("outcome") is not None:
                found[flow_id] = FlowOutcome.from_json(
                    flow_id, document["status"], document["outcome"]
                )
        return found

    def wait(
        self,
        flow_ids: Sequence[str],
        timeout: float,
        on_progress: Callable[[int, int], None] | None = None,
        poll_seconds: float = 0.1,
    ) -> dict[str, FlowOutcome]:
        """Wait until every flow finished; ``on_progress(done, total)`` is called as they do.

        Raises :class:`~flows.node.client.FlowWaitTimeoutError` after ``timeout`` seconds, as
        ``NodeClient.wait`` does.
        """
        return wait_for_outcomes(self.outcomes, flow_ids, timeout, on_progress, poll_seconds)

    def result(self, flow_id: str) -> Any:
        """The result of a finished flow (JSON, as the API gives it), or its error raised.

        The error is raised as ``NodeClient.result`` raises it (``exception_from_error``),
        with the traceback the node kept as its ``__cause__``. Raises
        :class:`~flows.errors.FlowStillRunningError` if the flow has not finished.
        """
        outcome = self.outcomes([flow_id]).get(flow_id)
        if outcome is None:
            raise FlowStillRunningError(f"flow {flow_id} has not finished")
        return outcome.value()

    def progress(self, flow_id: str, timeout: float | None = None) -> Iterator[FlowEvent]:
        """The flow's progress stream: ``status`` events as they happen, then the outcome.

        The last event is ``outcome`` (or ``gone``); the iterator ends there. An unknown flow
        raises RpcNotFoundError before the first event. With ``timeout`` (seconds), a flow
        that has not ended by then raises :class:`~flows.node.client.FlowWaitTimeoutError` (seen
        at the next line the node sends: an event, or its keep-alive every 15 s).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        read = STREAM_READ_SECONDS if timeout is None else min(timeout, STREAM_READ_SECONDS)
        limits = httpx.Timeout(self.timeout, read=max(read, 0.1))
        path = f"/api/flows/{_path(flow_id)}/events"

        def lines(response: httpx.Response) -> Iterator[str]:
            for line in response.iter_lines():
                if deadline is not None and time.monotonic() > deadline:
                    raise FlowWaitTimeoutError(
                        f"flow {flow_id} had not finished after {timeout:g} s"
                    )
                yield line

        try:
            with self._http.stream("GET", path, timeout=limits) as response:
                if response.status_code != 200:
                    response.read()
                    raise _refusal(response)
                yield from parse_events(lines(response))
        except httpx.ReadTimeout as error:
            if deadline is not None and time.monotonic() >= deadline - 0.01:
                raise FlowWaitTimeoutError(
                    f"flow {flow_id} had not finished after {timeout:g} s"
                ) from None
            raise RpcConnectionError(f"{self.url}: {_first_line(error)}") from error
        except httpx.TransportError as error:
            raise RpcConnectionError(f"{self.url}: {_first_line(error)}") from error

    # --- operations -------------------------------------------------------------------------

    def kill(self, flow_id: str) -> str:
        """Kill the flow; the node's outcome line (RpcConflictError if it refused)."""
        return self._operate(f"/api/flows/{_path(flow_id)}/kill")

    def pause(self, flow_id: str) -> str:
        """Pause the flow (it runs nothing until resumed); the node's outcome line."""
        return self._operate(f"/api/flows/{_path(flow_id)}/pause")

    def resume(self, flow_id: str) -> str:
        """Resume a paused flow; the node's outcome line."""
        return self._operate(f"/api/flows/{_path(flow_id)}/resume")

    def retry(self, flow_id: str) -> str:
        """Retry a flow in the hospital; the node's outcome line."""
        return self._operate(f"/api/flows/{_path(flow_id)}/retry")

    def drain(self) -> str:
        """Have the node start no new flows; the node's outcome line."""
        return self._operate("/api/node/drain")

    def undrain(self) -> str:
        """Have the node accept new flows again; the node's outcome line."""
        return self._operate("/api/node/undrain")

    def _operate(self, path: str) -> str:
        return str(self._json("POST", path)["outcome"])

    # --- the node ---------------------------------------------------------------------------

    def node_info(self) -> dict[str, Any]:
        """The node's name, version, process, draining flag and flow counts."""
        document: dict[str, Any] = self._json("GET", "/api/node")
        return document

    def health(self) -> bool:
        """True if the server answers (``GET /health``); RpcConnectionError if it cannot."""
        return self._send("GET", "/health").status_code == 200

    def ready(self) -> bool:
        """True if the process holds the node's lease and serves (``GET /ready``)."""
        response = self._send("GET", "/ready")
        if response.status_code not in (200, 503):
            raise _refusal(response)
        return response.status_code == 200

    # --- plumbing ---------------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise RpcConnectionError(f"{self.url}: {_first_line(error)}") from error

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if not 200 <= response.status_code < 300:
            raise _refusal(response)
        try:
            return response.json()
        except ValueError as error:
            raise RpcError(
                f"{path}: the answer is not JSON: {error}", response.status_code
            ) from None

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def flow_arguments(flow: FlowLogic[Any]) -> dict[str, Any]:
    """A flow instance's constructor arguments by name (the API passes them by name)."""
    args, kwargs = flow._ff_args
    signature = inspect.signature(type(flow).__init__)
    try:
        bound = signature.bind(None, *args, **kwargs)
    except TypeError as error:
        raise ValueError(f"{type(flow).__qualname__}: {error}") from None
    names = list(signature.parameters)
    arguments = dict(bound.arguments)
    arguments.pop(names[0], None)  # self
    for name, parameter in signature.parameters.items():
        if parameter.kind is parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
        elif (
            parameter.kind in (parameter.VAR_POSITIONAL, parameter.POSITIONAL_ONLY)
            and name in arguments
        ):
            raise ValueError(
                f"{type(flow).__qualname__}: positional-only or *args arguments cannot "
                "be passed over the API"
            )
    return arguments


def _refusal(response: httpx.Response) -> RpcError:
    try:
        reason = str(response.json()["error"])
    except (ValueError, KeyError, TypeError):
        reason = response.text.strip().splitlines()[0] if response.text.strip() else ""
    return error_for_status(response.status_code, reason or f"HTTP {response.status_code}")


def _path(flow_id: str) -> str:
    if not isinstance(flow_id, str) or not flow_id:
        raise ValueError(f"not a flow id: {flow_id!r}")
    return urllib.parse.quote(flow_id, safe="")


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
