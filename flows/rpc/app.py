"""The API's routes (Starlette): authentication, permissions, JSON in and out.

Every answer is JSON; a refusal is ``{"error": "<one line>"}`` with its status: 400 (bad
input), 401 (no or wrong credentials), 403 (not permitted), 404, 409, 413 (body too large),
503 (draining, not ready), 504 (the node did not answer an operation in time). The routes
and their permissions are in :data:`ROUTES_DOC`; docs/rpc.md describes each.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from flows.config.rpc import RpcUser
from flows.rpc.arguments import ArgumentError
from flows.rpc.auth import AuthenticationError, Authenticator
from flows.rpc.console.routes import console_routes
from flows.rpc.events import progress_events
from flows.rpc.gateway import (
    FLOW_ACTIONS,
    MAX_CLIENT_REQUEST_ID_CHARS,
    MAX_PAGE,
    NODE_ACTIONS,
    ApiError,
    ListQuery,
    NodeGateway,
)

log = logging.getLogger("fiberflow.rpc")

ROUTES_DOC = {
    "GET /health": "none",
    "GET /ready": "none",
    "POST /api/flows": "start (the class)",
    "GET /api/flows": "observe",
    "GET /api/flows/{flow_id}": "observe",
    "GET /api/flows/{flow_id}/events": "observe",
    "POST /api/flows/{flow_id}/{kill|pause|resume|retry}": "operate",
    "GET /api/node": "observe",
    "POST /api/node/{drain|undrain}": "operate",
}
"""Each route and the permission it needs."""

_START_FIELDS = {"class", "args", "client_request_id"}
_LIST_PARAMETERS = {"status", "class", "min_age", "max_age", "finished", "limit", "after"}

Handler = Callable[[Request, RpcUser], Awaitable[Response]]


def build_app(
    gateway: NodeGateway,
    authenticator: Authenticator,
    max_body_bytes: int,
    metrics_app: ASGIApp | None = None,
    *,
    secure_cookies: bool = False,
) -> Starlette:
    """The API's ASGI app; ``metrics_app`` (if any) is mounted at ``/metrics`` as it is.

    The web console is mounted at ``/console/`` (:mod:`flows.rpc.console`); ``secure_cookies``
    marks its session cookie HTTPS-only (the API serves TLS).
    """

    def guarded(permission: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                header = request.headers.get("authorization")
                user = await run_in_threadpool(authenticator.user_for, header)
                if permission == "observe" and not user.observe:
                    raise ApiError(403, f"user {user.name} may not observe")
                if permission == "operate" and not user.operate:
                    raise ApiError(403, f"user {user.name} may not operate")
                return await handler(request, user)
            except AuthenticationError as error:
                return JSONResponse(
                    {"error": str(error)},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Basic realm="fiberflow", Bearer'},
                )
            except ApiError as error:
                return _error(error.status, error.message)
            except Exception as error:
                log.exception("%s %s failed", request.method, request.url.path)
                return _error(500, f"internal error: {type(error).__name__}")

        return endpoint

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "alive"})

    async def ready(_: Request) -> Response:
        is_ready = await run_in_threadpool(gateway.ready)
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    async def start(request: Request, user: RpcUser) -> Response:
        body = await _json_body(request, max_body_bytes)
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object {class, args, client_request_id}")
        unknown = sorted(set(body) - _START_FIELDS)
        if unknown:
            raise ApiError(
                400, f"unknown field {unknown[0]!r} (known: args, class, client_request_id)"
            )
        flow_class = body.get("class")
        if not isinstance(flow_class, str) or not flow_class:
            raise ApiError(400, "field 'class' must be a flow's qualified class name")
        arguments = body.get("args", {})
        if not isinstance(arguments, dict):
            raise ApiError(400, "field 'args' must be an object of argument names to values")
        request_id = body.get("client_request_id")
        if request_id is not None and (
            not isinstance(request_id, str)
            or not 0 < len(request_id) <= MAX_CLIENT_REQUEST_ID_CHARS
        ):
            raise ApiError(
                400,
                f"field 'client_request_id' must be a string of 1 to "
                f"{MAX_CLIENT_REQUEST_ID_CHARS} characters",
            )
        started = await run_in_threadpool(
            _starting, gateway, user, flow_class, arguments, request_id
        )
        return JSONResponse(started.document, status_code=201 if started.created else 200)

    async def list_flows(request: Request, _: RpcUser) -> Response:
        query = _list_query(request)
        return JSONResponse(await run_in_threadpool(gateway.list_flows, query))

    async def flow(request: Request, _: RpcUser) -> Response:
        flow_id = request.path_params["flow_id"]
        return JSONResponse(await run_in_threadpool(gateway.flow, flow_id))

    async def events(request: Request, _: RpcUser) -> Response:
        flow_id = request.path_params["flow_id"]
        await run_in_threadpool(gateway.progress, flow_id)  # 404 before the stream starts
        return StreamingResponse(
            progress_events(gateway, flow_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def operate_flow(request: Request, _: RpcUser) -> Response:
        action = request.path_params["action"]
        if action not in FLOW_ACTIONS:
            raise ApiError(404, f"no operation {action!r} (known: {', '.join(FLOW_ACTIONS)})")
        flow_id = request.path_params["flow_id"]
        return JSONResponse(await run_in_threadpool(gateway.operate, action, flow_id))

    async def node(_: Request, __: RpcUser) -> Response:
        return JSONResponse(await run_in_threadpool(gateway.node_info))

    async def operate_node(request: Request, _: RpcUser) -> Response:
        action = request.path_params["action"]
        if action not in NODE_ACTIONS:
            raise ApiError(404, f"no node operation {action!r} (known: drain, undrain)")
        return JSONResponse(await run_in_threadpool(gateway.operate, action, None))

    routes: list[Route | Mount] = [
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/api/flows", guarded("start", start), methods=["POST"]),
        Route("/api/flows", guarded("observe", list_flows), methods=["GET"]),
        Route("/api/flows/{flow_id}", guarded("observe", flow), methods=["GET"]),
        Route("/api/flows/{flow_id}/events", guarded("observe", events), methods=["GET"]),
        Route("/api/flows/{flow_id}/{action}", guarded("operate", operate_flow), methods=["POST"]),
        Route("/api/node", guarded("observe", node), methods=["GET"]),
        Route("/api/node/{action}", guarded("operate", operate_node), methods=["POST"]),
        Mount(
            "/console",
            routes=console_routes(gateway, authenticator, max_body_bytes, secure_cookies),
        ),
    ]
    if metrics_app is not None:  # exactly /metrics (a Mount would redirect it to /metrics/)
        routes.append(Route("/metrics", _AsgiEndpoint(metrics_app), methods=["GET"]))
    app = Starlette(routes=routes)
    app.add_exception_handler(404, _not_found)
    app.add_exception_handler(405, _not_allowed)
    return app


def _starting(
    gateway: NodeGateway,
    user: RpcUser,
    flow_class: str,
    arguments: dict[str, Any],
    request_id: str | None,
) -> Any:
    """``gateway.start``, with argument errors as 400."""
    try:
        return gateway.start(user, flow_class, arguments, request_id)
    except ArgumentError as error:
        raise ApiError(400, str(error)) from None


async def _json_body(request: Request, limit: int) -> Any:
    """The request's body as JSON; 413 past ``limit`` bytes, 400 if it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, "malformed Content-Length")
        if int(declared) > limit:
            raise ApiError(413, f"the body is larger than {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the body is larger than {limit} bytes")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(400, f"malformed JSON: {error}") from None


def _list_query(request: Request) -> ListQuery:
    """The filters of ``GET /api/flows``; 400 naming a bad one."""
    params = request.query_params
    unknown = sorted(set(params) - _LIST_PARAMETERS)
    if unknown:
        raise ApiError(
            400, f"unknown parameter {unknown[0]!r} (known: {', '.join(sorted(_LIST_PARAMETERS))})"
        )

    def seconds(name: str) -> float | None:
        text = params.get(name)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            raise ApiError(400, f"parameter {name!r} must be seconds, not {text[:40]!r}") from None
        if not value >= 0:
            raise ApiError(400, f"parameter {name!r} must be zero or more seconds")
        return value

    limit_text = params.get("limit", "100")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_PAGE:
        raise ApiError(400, f"parameter 'limit' must be 1 to {MAX_PAGE}")
    finished = params.get("finished", "false").lower()
    if finished not in ("true", "false", "1", "0"):
        raise ApiError(400, "parameter 'finished' must be true or false")
    statuses = frozenset(
        s.strip().upper() for s in params.get("status", "").split(",") if s.strip()
    )
    return ListQuery(
        statuses=statuses,
        flow_class=params.get("class") or None,
        min_age=seconds("min_age"),
        max_age=seconds("max_age"),
        finished=finished in ("true", "1"),
        limit=int(limit_text),
        after=params.get("after", ""),
    )


def _error(status: int, message: str) -> JSONResponse:
    line = message.splitlines()[0] if message else "error"
    return JSONResponse({"error": line}, status_code=status)


async def _not_found(request: Request, _: Exception) -> Response:
    return _error(404, f"no route {request.method} {request.url.path}")


async def _not_allowed(request: Request, _: Exception) -> Response:
    return _error(405, f"{request.method} is not allowed on {request.url.path}")


class _AsgiEndpoint:
    """An ASGI app as a route's endpoint (an object, so Starlette hands it the raw scope)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)
