"""A node serving the API and its console, and logging in to the console over plain HTTP."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from flows.config.rpc import RpcConfig
from flows.process.process import NodeProcess
from flows.rpc.console.sessions import SESSION_COOKIE
from tests.process.test_rpc_api import node_config, rpc_users
from tests.process.test_runtime import running
from tests.rpc_helpers import PASSWORDS, basic
from tests.waiting import wait_until

STEPS = "tests.rpc_cordapp.StepsFlow"
HOSPITAL = "tests.rpc_cordapp.HospitalFlow"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@contextlib.contextmanager
def console_node(tmp_path: Path) -> Iterator[tuple[NodeProcess, str]]:
    """A node process (in a thread) serving the API with the RPC tests' users; its base URL."""
    config = node_config(tmp_path, RpcConfig(port=0, users=rpc_users()))
    with running([config]) as processes:
        process = processes[0]
        wait_until(lambda: process.rpc_server is not None, "the API to be served", 60)
        assert process.rpc_server is not None
        url = process.rpc_server.url
        with httpx.Client(base_url=url, timeout=60) as http:
            wait_until(lambda: http.get("/ready").status_code == 200, "the node to be ready")
        yield process, url


@contextlib.contextmanager
def logged_in(url: str, user: str, password: str | None = None) -> Iterator[httpx.Client]:
    """An HTTP client holding a console session of ``user`` (AssertionError if refused)."""
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = post_login(
            http, {"user": user, "password": PASSWORDS[user] if password is None else password}
        )
        assert answer.status_code == 303, answer.text
        yield http


def post_login(http: httpx.Client, data: dict[str, str]) -> httpx.Response:
    """Log in as a browser does: fetch the login form (its CSRF token and cookie), post it."""
    form = http.get("/console/login")
    found = _CSRF.search(form.text)
    assert found is not None, "no CSRF token on the login form"
    return http.post("/console/login", data={**data, "csrf": found.group(1)})


def session_cookie_header(answer: httpx.Response) -> str:
    """The Set-Cookie header of the console's session cookie in ``answer``."""
    headers = [
        h for h in answer.headers.get_list("set-cookie") if h.startswith(SESSION_COOKIE + "=")
    ]
    assert len(headers) == 1, answer.headers.get_list("set-cookie")
    return headers[0]


def csrf_of(http: httpx.Client, page: str = "/console/") -> str:
    """The session's CSRF token, as a page's forms carry it."""
    found = _CSRF.search(http.get(page, follow_redirects=True).text)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


def start_by_api(url: str, flow_class: str, args: dict[str, object]) -> str:
    """Start a flow through the HTTP API as the user with every permission; its id."""
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = http.post(
            "/api/flows", json={"class": flow_class, "args": args}, headers=basic("everything")
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["flow_id"])


def flow_document(url: str, flow_id: str) -> dict[str, Any]:
    """The flow's document from the API."""
    with httpx.Client(base_url=url, timeout=60) as http:
        answer = http.get(f"/api/flows/{flow_id}", headers=basic("watcher"))
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


def flow_status(url: str, flow_id: str) -> str:
    """The flow's status as the API reports it."""
    return str(flow_document(url, flow_id)["status"])
