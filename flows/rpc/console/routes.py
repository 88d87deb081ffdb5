"""The console's pages and forms under ``/console/``, and the permission each needs.

Every page but the login form needs a session (:mod:`flows.rpc.console.sessions`); a page
without one redirects to the login form, a form posted without one is refused (401). Every
form that changes something carries the session's CSRF token: a POST without it, or with
another, is refused (403) before anything happens. The permissions are the API's (see
:data:`PAGE_PERMISSIONS`); everything a page shows or does goes through the API's
:class:`flows.rpc.gateway.NodeGateway`, so the console can do nothing the API cannot.
"""

from __future__ import annotations

import datetime
import json
import logging
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from flows.config.rpc import RpcUser
from flows.markings import is_startable_by_rpc, responder_initiator
from flows.rpc.arguments import ArgumentError
from flows.rpc.auth import AuthenticationError, Authenticator
from flows.rpc.console.forms import (
    ArgumentField,
    FormError,
    argument_fields,
    form_arguments,
    parse_form,
)
from flows.rpc.console.pages import render
from flows.rpc.console.sessions import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    Session,
    SessionStore,
    login_token,
    login_token_ok,
)
from flows.rpc.console.throughput import recent_throughput
from flows.rpc.gateway import (
    FLOW_ACTIONS,
    MAX_CLIENT_REQUEST_ID_CHARS,
    NODE_ACTIONS,
    ApiError,
    ListQuery,
    NodeGateway,
)

log = logging.getLogger("fiberflow.console")

PREFIX = "/console"
PAGE_PERMISSIONS = {
    "GET /console/login, POST /console/login": "none (a user with a password)",
    "POST /console/logout": "a session",
    "GET /console/flows, GET /console/flows/{flow_id}, GET /console/node": "observe",
    "GET /console/hospital": "observe or operate",
    "POST /console/flows/{flow_id}/{kill|pause|resume|retry}": "operate",
    "POST /console/node/{drain|undrain}": "operate",
    "GET /console/start": "a non-empty start list",
    "POST /console/start": "the class in the user's start list",
}
"""Each console page or form and the permission it needs."""
LIVE_STATUSES = ("RUNNABLE", "SUSPENDED", "RUNNING", "HOSPITALIZED", "PAUSED")
FINISHED_STATUSES = ("COMPLETED", "FAILED")
SHOWS = ("all", "live", "finished")
PAGE_SIZE = 50
"""Flows per page of the flows list and the hospital."""
REFRESH_SECONDS = 5
"""Pages that change by themselves reload this often (unless ``refresh=off``)."""

Handler = Callable[[Request, Session, dict[str, str]], Awaitable[Response]]


def console_routes(
    gateway: NodeGateway,
    authenticator: Authenticator,
    max_body_bytes: int,
    secure_cookies: bool = False,
) -> list[Route]:
    """The console's routes (paths under :data:`PREFIX`) over ``gateway``.

    ``secure_cookies``: the session cookie is sent over HTTPS only (the API serves TLS).
    """
    sessions = SessionStore()

    def page(permission: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = sessions.get(request.cookies.get(SESSION_COOKIE))
            if session is None:
                if request.method == "GET":
                    target = urllib.parse.quote(request.url.path, safe="/")
                    return RedirectResponse(f"{PREFIX}/login?next={target}", 303)
                return _refused(401, "log in first: this form needs a session", None)
            try:
                form: dict[str, str] = {}
                if request.method == "POST":
                    body = await _body(request, max_body_bytes)
                    form = parse_form(request.headers.get("content-type"), body)
                    if not session.csrf_ok(form.get("csrf")):
                        return _refused(
                            403,
                            "the form's CSRF token is missing or wrong: reload the page and "
                            "send the form again",
                            session,
                        )
                problem = _permission_problem(permission, session.user)
                if problem is not None:
                    return _refused(403, problem, session)
                return await handler(request, session, form)
            except FormError as error:
                return _refused(error.status, str(error), session)
            except ApiError as error:
                return _refused(error.status, error.message, session)
            except Exception as error:
                log.exception("%s %s failed", request.method, request.url.path)
                return _refused(500, f"internal error: {type(error).__name__}", session)

        return endpoint

    def context(session: Session, **values: Any) -> dict[str, Any]:
        return {
            "session": session,
            "note": sessions.take_note(session.session_id),
            "refresh": None,
            **values,
        }

    async def index(_: Request, session: Session, __: dict[str, str]) -> Response:
        user = session.user
        if user.observe:
            return RedirectResponse(f"{PREFIX}/flows", 303)
        if user.start:
            return RedirectResponse(f"{PREFIX}/start", 303)
        if user.operate:
            return RedirectResponse(f"{PREFIX}/hospital", 303)
        return _refused(403, f"user {user.name} has no permission for any page", session)

    async def login_page(request: Request) -> Response:
        target = _local_target(request.query_params.get("next"))
        if sessions.get(request.cookies.get(SESSION_COOKIE)) is not None:
            return RedirectResponse(target, 303)
        return login_form(target)

    def login_form(target: str, status: int = 200, **values: Any) -> Response:
        """The login form with a fresh CSRF token, set in its cookie too."""
        token = login_token()
        response = render(
            "login.html",
            status=status,
            session=None,
            note=None,
            refresh=None,
            target=target,
            login_csrf=token,
            **values,
        )
        response.set_cookie(
            LOGIN_COOKIE,
            token,
            path=PREFIX,
            httponly=True,
            samesite="strict",
            secure=secure_cookies,
        )
        return response

    async def login(request: Request) -> Response:
        try:
            form = parse_form(
                request.headers.get("content-type"), await _body(request, max_body_bytes)
            )
        except FormError as error:
            return _refused(error.status, str(error), None)
        target = _local_target(form.get("next"))
        if not login_token_ok(request.cookies.get(LOGIN_COOKIE), form.get("csrf")):
            return login_form(
                target,
                status=403,
                error="the login form's CSRF token is missing or wrong (an old form, or one "
                "posted from another site): log in on this page",
                name=form.get("user", ""),
            )
        try:
            user = await run_in_threadpool(
                authenticator.password_user, form.get("user", ""), form.get("password", "")
            )
        except AuthenticationError as error:
            return login_form(target, status=401, error=str(error), name=form.get("user", ""))
        session = sessions.create(user)
        response = RedirectResponse(target, 303)
        response.delete_cookie(
            LOGIN_COOKIE, path=PREFIX, httponly=True, samesite="strict", secure=secure_cookies
        )
        response.set_cookie(
            SESSION_COOKIE,
            session.session_id,
            path=PREFIX,
            httponly=True,
            samesite="strict",
            secure=secure_cookies,
        )
        return response

    async def logout(_: Request, session: Session, __: dict[str, str]) -> Response:
        sessions.end(session.session_id)
        response = RedirectResponse(f"{PREFIX}/login", 303)
        response.delete_cookie(
            SESSION_COOKIE, path=PREFIX, httponly=True, samesite="strict", secure=secure_cookies
        )
        return response

    async def listed_page(
        page: str, query: ListQuery, filters: dict[str, str]
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a flow list (each flow with its age shown) and the next page's URL."""
        listed = await run_in_threadpool(gateway.list_flows, query)
        flows: list[dict[str, Any]] = listed["flows"]
        for item in flows:
            item["age"] = _age(item["age_seconds"])
        next_url = None
        if listed["next"] is not None:
            next_url = _url(page, {**filters, "after": listed["next"]})
        return flows, next_url

    async def flows_page(request: Request, session: Session, _: dict[str, str]) -> Response:
        params = request.query_params
        status = params.get("status", "")
        show = params.get("show", "all")
        flow_class = params.get("class", "").strip()
        after = params.get("after", "")
        if status and status not in LIVE_STATUSES + FINISHED_STATUSES:
            raise ApiError(400, f"unknown status {status[:40]!r}")
        if show not in SHOWS:
            raise ApiError(400, f"unknown choice show={show[:40]!r} (all, live or finished)")
        statuses = frozenset([status] if status else [])
        if show == "finished" and not statuses:
            statuses = frozenset(FINISHED_STATUSES)
        query = ListQuery(
            statuses=statuses,
            flow_class=flow_class or None,
            finished=show != "live" or status in FINISHED_STATUSES,
            limit=PAGE_SIZE,
            after=after,
        )
        filters = {"status": status, "show": show, "class": flow_class}
        flows, next_url = await listed_page("flows", query, filters)
        return render(
            "flows.html",
            **context(
                session,
                refresh=_refresh(request),
                flows=flows,
                filters=filters,
                statuses=LIVE_STATUSES + FINISHED_STATUSES,
                shows=SHOWS,
                next_url=next_url,
                paged=bool(after),
                first_url=_url("flows", filters),
                stop_url=_url("flows", {**filters, "after": after, "refresh": "off"}),
            ),
        )

    async def flow_page(request: Request, session: Session, _: dict[str, str]) -> Response:
        flow_id = request.path_params["flow_id"]
        document = await run_in_threadpool(gateway.flow, flow_id)
        status = document["status"]
        ended = status in FINISHED_STATUSES
        since = document["ended_at"] if ended else document["created_at"]
        outcome = document["outcome"] or {}
        error = outcome.get("error") if isinstance(outcome.get("error"), dict) else None
        actions = []
        if session.user.operate and status in LIVE_STATUSES:
            actions = ["kill", "resume" if status == "PAUSED" else "pause"]
            if status == "HOSPITALIZED":
                actions.insert(0, "retry")
        return render(
            "flow.html",
            **context(
                session,
                refresh=None if ended else _refresh(request),
                flow=document,
                age=_age_since(since),
                age_meaning="since it ended" if ended else "since it started",
                sessions_shown=[_session_row(s) for s in document["sessions"]],
                pending=_compact(document["pending"]),
                origin=_compact(document["origin"]),
                result=_compact(outcome["result"]) if "result" in outcome else None,
                failure=error,
                actions=actions,
                back=f"{PREFIX}/flows/{urllib.parse.quote(flow_id, safe='')}",
                stop_url=f"{PREFIX}/flows/{urllib.parse.quote(flow_id, safe='')}?refresh=off",
            ),
        )

    async def hospital_page(request: Request, session: Session, _: dict[str, str]) -> Response:
        after = request.query_params.get("after", "")
        query = ListQuery(statuses=frozenset({"HOSPITALIZED"}), limit=PAGE_SIZE, after=after)
        flows, next_url = await listed_page("hospital", query, {})
        return render(
            "hospital.html",
            **context(
                session,
                refresh=_refresh(request),
                flows=flows,
                next_url=next_url,
                paged=bool(after),
                back=f"{PREFIX}/hospital",
                stop_url=_url("hospital", {"after": after, "refresh": "off"}),
            ),
        )

    async def operate_and_note(
        session: Session, action: str, flow_id: str | None, what: str
    ) -> None:
        """Run an operation; its outcome, or why it was refused, is the next page's note.

        A request the user may not make (400, 401, 403) is raised instead, to be refused.
        """
        try:
            done = await run_in_threadpool(gateway.operate, action, flow_id)
            sessions.note(session.session_id, f"{what}: {done['outcome']}")
        except ApiError as error:
            if error.status in (400, 401, 403):
                raise
            sessions.note(session.session_id, f"{what} refused: {error.message}")

    async def operate_flow(request: Request, session: Session, form: dict[str, str]) -> Response:
        action = request.path_params["action"]
        flow_id = request.path_params["flow_id"]
        if action not in FLOW_ACTIONS:
            raise ApiError(404, f"no operation {action!r} (known: {', '.join(FLOW_ACTIONS)})")
        back = _local_target(form.get("back"))
        await operate_and_note(session, action, flow_id, f"{action} {flow_id}")
        return RedirectResponse(back, 303)

    async def node_page(request: Request, session: Session, _: dict[str, str]) -> Response:
        info = await run_in_threadpool(gateway.node_info)
        throughput = await run_in_threadpool(recent_throughput, gateway.database)
        return render(
            "node.html",
            **context(
                session,
                refresh=_refresh(request),
                info=info,
                process=_compact(info["process"]),
                throughput=throughput,
                back=f"{PREFIX}/node",
                stop_url=f"{PREFIX}/node?refresh=off",
            ),
        )

    async def operate_node(request: Request, session: Session, form: dict[str, str]) -> Response:
        action = request.path_params["action"]
        if action not in NODE_ACTIONS:
            raise ApiError(404, f"no node operation {action!r} (known: drain, undrain)")
        await operate_and_note(session, action, None, action)
        return RedirectResponse(f"{PREFIX}/node", 303)

    def start_forms(user: RpcUser) -> list[dict[str, Any]]:
        forms = []
        for name in gateway.cordapps.flow_classes():
            cls = gateway.cordapps.flow_class(name)
            if cls is None or not user.may_start(name) or not is_startable_by_rpc(cls):
                continue
            if responder_initiator(cls) is not None:
                continue
            fields: tuple[ArgumentField, ...] = ()
            problem = None
            try:
                fields = argument_fields(cls)
            except ArgumentError as error:
                problem = str(error)
            forms.append(
                {
                    "class": name,
                    "fields": fields,
                    "problem": problem,
                    "request_id": f"console-{uuid.uuid4().hex}",
                }
            )
        return forms

    async def start_page(_: Request, session: Session, __: dict[str, str]) -> Response:
        return render(
            "start.html",
            **context(session, forms=start_forms(session.user), submitted={}, error=None),
        )

    async def start(_: Request, session: Session, form: dict[str, str]) -> Response:
        user = session.user
        flow_class = form.get("class", "")
        request_id = form.get("client_request_id", "")
        try:
            if not user.may_start(flow_class):
                raise ApiError(403, f"user {user.name} may not start {flow_class[:200]}")
            if not 0 < len(request_id) <= MAX_CLIENT_REQUEST_ID_CHARS:
                raise ApiError(400, "the form has no client request id: reload the start page")
            cls = gateway.cordapps.flow_class(flow_class)
            if cls is None:
                raise ApiError(400, f"{flow_class} is not a flow of node {gateway.node_name}")
            arguments = form_arguments(argument_fields(cls), form)
            started = await run_in_threadpool(
                gateway.start, user, flow_class, arguments, request_id
            )
        except (ApiError, ArgumentError) as error:
            status = error.status if isinstance(error, ApiError) else 400
            forms = start_forms(user)
            for shown in forms:
                if shown["class"] == flow_class:
                    shown["request_id"] = request_id  # nothing was started: the same id
            return render(
                "start.html",
                status=status,
                **context(
                    session,
                    forms=forms,
                    submitted=form,
                    error=f"{flow_class}: {error}",
                ),
            )
        flow_id = started.document["flow_id"]
        sessions.note(
            session.session_id,
            f"this form was sent before: it started flow {flow_id}"
            if not started.created
            else f"started {flow_class} as flow {flow_id}",
        )
        if not user.observe:  # it may not see the flow's page: back to the start forms
            return RedirectResponse(f"{PREFIX}/start", 303)
        return RedirectResponse(f"{PREFIX}/flows/{urllib.parse.quote(flow_id, safe='')}", 303)

    return [
        Route("/", page("session", index), methods=["GET"]),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", page("session", logout), methods=["POST"]),
        Route("/flows", page("observe", flows_page), methods=["GET"]),
        Route("/flows/{flow_id}", page("observe", flow_page), methods=["GET"]),
        Route("/flows/{flow_id}/{action}", page("operate", operate_flow), methods=["POST"]),
        Route("/hospital", page("hospital", hospital_page), methods=["GET"]),
        Route("/node", page("observe", node_page), methods=["GET"]),
        Route("/node/{action}", page("operate", operate_node), methods=["POST"]),
        Route("/start", page("start", start_page), methods=["GET"]),
        Route("/start", page("start", start), methods=["POST"]),
    ]


def _permission_problem(permission: str, user: RpcUser) -> str | None:
    """Why ``user`` may not use a page that needs ``permission``, or None."""
    if permission == "observe" and not user.observe:
        return f"user {user.name} may not observe (observe = true in its [[rpc.users]] entry)"
    if permission == "operate" and not user.operate:
        return f"user {user.name} may not operate (operate = true in its [[rpc.users]] entry)"
    if permission == "hospital" and not (user.observe or user.operate):
        return f"user {user.name} may neither observe nor operate"
    if permission == "start" and not user.start:
        return f"user {user.name} may start no flow (its start list is empty)"
    return None


def _refused(status: int, message: str, session: Session | None) -> Response:
    line = message.splitlines()[0] if message else "refused"
    return render(
        "message.html",
        status=status,
        session=session,
        note=None,
        refresh=None,
        status_code=status,
        message=line,
    )


async def _body(request: Request, limit: int) -> bytes:
    """The request's body; FormError 413 past ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise FormError(413, f"the form is larger than {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise FormError(413, f"the form is larger than {limit} bytes")
    return bytes(body)


def _local_target(target: str | None) -> str:
    """``target`` if it is a console path (never another site), else the console's start."""
    if target and target.startswith(PREFIX + "/") and "//" not in target and "\\" not in target:
        return target
    return PREFIX + "/"


def _refresh(request: Request) -> int | None:
    return None if request.query_params.get("refresh") == "off" else REFRESH_SECONDS


def _url(page: str, params: dict[str, str]) -> str:
    kept = {name: value for name, value in params.items() if value}
    return f"{PREFIX}/{page}" + (f"?{urllib.parse.urlencode(kept)}" if kept else "")


def _age(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def _age_since(iso: str | None) -> str | None:
    if iso is None:
        return None
    moment = datetime.datetime.fromisoformat(iso)
    now = datetime.datetime.now(datetime.UTC)
    return _age(max(0.0, (now - moment).total_seconds()))


def _session_row(session: Any) -> dict[str, Any]:
    if not isinstance(session, dict):
        return {"counterparty": "-", "session_id": "-", "details": _compact(session)}
    details = {
        key: session[key]
        for key in ("initiated_by_us", "initiating_flow", "confirmed", "closed_by_us")
        if key in session
    }
    details["inbox"] = len(session.get("inbox") or ())
    return {
        "counterparty": session.get("counterparty", "-"),
        "session_id": session.get("session_id", "-"),
        "details": _compact(details),
    }


def _compact(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, default=str)
