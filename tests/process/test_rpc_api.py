"""The HTTP API of a running node: every endpoint x every kind of caller, starts, bad input.

One node process runs in a thread of the test (``tests.process.test_runtime.running``) with an
``[rpc]`` section; the requests go over a real socket to the uvicorn server it started.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from flows.config.rpc import RpcConfig, RpcUser
from flows.config.runtime import RuntimeConfig
from flows.process.process import NodeProcess
from persistence import schema
from persistence.store import NodeDatabase
from tests.conftest import POSTGRES_URL
from tests.process.test_runtime import running, unique_name
from tests.rpc_cordapp import gate
from tests.rpc_helpers import PASSWORDS, TOKEN, basic, bearer, users_table
from tests.waiting import wait_until

STEPS = "tests.rpc_cordapp.StepsFlow"
TYPED = "tests.rpc_cordapp.TypedFlow"
PING = "samples.pingpong.flows.PingFlow"


def rpc_users() -> tuple[RpcUser, ...]:
    return tuple(
        RpcUser(
            u["name"],
            password_hash=u.get("password_hash"),
            token_hash=u.get("token_hash"),
            start=tuple(u.get("start", ())),
            observe=u.get("observe", False),
            operate=u.get("operate", False),
        )
        for u in users_table()
    )


def node_config(
    tmp_path: Path, rpc: RpcConfig, name: str | None = None, schema: str | None = None
) -> RuntimeConfig:
    """A node of the RPC tests: on SQLite, or with ``schema`` on the tests' PostgreSQL."""
    name = name or unique_name("Alice")
    short = uuid.uuid4().hex[:6]
    return RuntimeConfig(
        name=name,
        database_url=POSTGRES_URL if schema else f"sqlite:///{tmp_path / (short + '.db')}",
        database_schema=schema,
        transport_url=f"sqlite:///{tmp_path / 'queue.db'}",
        cordapps=("samples.pingpong", "tests.rpc_cordapp"),
        network_map=tmp_path / "network-map",
        synchronous="NORMAL",
        key_file=tmp_path / f"{short}.key.pem",
        rpc=rpc,
    )


class Api:
    """The running node's API, its process and its database."""

    def __init__(self, process: NodeProcess, config: RuntimeConfig) -> None:
        self.process = process
        self.config = config
        self.http = httpx.Client(base_url=process.rpc_server.url, timeout=60)
        self.database = NodeDatabase(config.database_url, create=False)

    def requests_written(self) -> int:
        table = schema.node_flow_requests
        with self.database.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(table)).scalar_one())

    def start(self, body: dict[str, Any], user: str = "everything") -> httpx.Response:
        headers = bearer() if user == "robot" else basic(user)
        return self.http.post("/api/flows", json=body, headers=headers)

    def finished(self, flow_id: str) -> dict[str, Any]:
        """The flow's document once it has an outcome."""
        found: dict[str, Any] = {}

        def ended() -> bool:
            found.update(self.http.get(f"/api/flows/{flow_id}", headers=basic("watcher")).json())
            return found.get("outcome") is not None

        wait_until(ended, f"flow {flow_id} to finish", 60)
        return found


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp_path = tmp_path_factory.mktemp("rpc-api")
    config = node_config(tmp_path, RpcConfig(port=0, users=rpc_users()))
    with running([config]) as processes:
        process = processes[0]
        wait_until(lambda: process.rpc_server is not None, "the API to be served", 60)
        api = Api(process, config)
        wait_until(lambda: api.http.get("/ready").status_code == 200, "the node to be ready")
        try:
            yield api
        finally:
            api.http.close()
            api.database.close()


@pytest.fixture(scope="module")
def held_flow(api: Api) -> str:
    """A live flow waiting at a gate no test opens (until the module ends)."""
    response = api.start({"class": STEPS, "args": {"steps": ["held-" + uuid.uuid4().hex[:6]]}})
    assert response.status_code == 201, response.text
    flow_id = response.json()["flow_id"]
    wait_until(
        lambda: (
            api.http.get(f"/api/flows/{flow_id}", headers=basic("watcher")).json()["status"]
            == "SUSPENDED"
        ),
        "the held flow to wait at its gate",
    )
    return flow_id


@pytest.fixture(scope="module")
def done_flow(api: Api) -> str:
    response = api.start({"class": STEPS, "args": {"steps": []}})
    assert response.status_code == 201, response.text
    flow_id = response.json()["flow_id"]
    api.finished(flow_id)
    return flow_id


# --- the permission matrix ------------------------------------------------------------------

ALLOWED = {
    "start": {"starter", "everything", "robot"},
    "observe": {"watcher", "everything", "robot"},
    "operate": {"operator", "everything"},
}
ENDPOINTS = [
    ("start", "POST", "/api/flows"),
    ("observe", "GET", "/api/flows"),
    ("observe", "GET", "/api/flows/{done}"),
    ("observe", "GET", "/api/flows/{done}/events"),
    ("observe", "GET", "/api/node"),
    ("operate", "POST", "/api/flows/{held}/pause"),
    ("operate", "POST", "/api/flows/{held}/resume"),
    ("operate", "POST", "/api/flows/{held}/retry"),
    ("operate", "POST", "/api/flows/{missing}/kill"),
    ("operate", "POST", "/api/node/drain"),
    ("operate", "POST", "/api/node/undrain"),
    ("none", "GET", "/health"),
    ("none", "GET", "/ready"),
]
CALLERS = [*sorted(PASSWORDS), "robot", "no credentials", "wrong password", "wrong token"]
ALLOWED["none"] = set(CALLERS)  # health and readiness need no credentials


def _headers(caller: str) -> dict[str, str]:
    if caller == "robot":
        return bearer()
    if caller == "no credentials":
        return {}
    if caller == "wrong password":
        return basic("everything", "not-the-password")
    if caller == "wrong token":
        return bearer(TOKEN + "x")
    return basic(caller)


ALLOWED_STATUS = {
    "POST /api/flows": 201,
    "POST /api/flows/{held}/retry": 409,  # the node refuses: the flow is not in the hospital
    "POST /api/flows/{missing}/kill": 404,  # no such flow: refused before the node is asked
}


@pytest.mark.parametrize(("permission", "method", "path"), ENDPOINTS)
@pytest.mark.parametrize("caller", CALLERS)
def test_permission_matrix(
    api: Api,
    held_flow: str,
    done_flow: str,
    permission: str,
    method: str,
    path: str,
    caller: str,
) -> None:
    url = path.format(held=held_flow, done=done_flow, missing="no-such-flow")
    body = {"class": STEPS, "args": {"steps": []}} if method == "POST" else None
    if path.endswith("/resume") and caller in ALLOWED[permission]:
        paused = api.http.post(f"/api/flows/{held_flow}/pause", headers=basic("operator"))
        assert paused.json()["outcome"] == f"ok: pause {held_flow}"
    response = api.http.request(
        method, url, headers=_headers(caller), json=body if path == "/api/flows" else None
    )
    answer = (
        response.json() if response.headers["content-type"].startswith("application/json") else None
    )
    if permission != "none" and caller in ("no credentials", "wrong password", "wrong token"):
        assert response.status_code == 401, response.text
        assert "error" in answer and "WWW-Authenticate" in response.headers
    elif caller in ALLOWED[permission]:
        expected = ALLOWED_STATUS.get(f"{method} {path}", 200)
        assert response.status_code == expected, response.text
        if path.endswith("/resume"):
            assert answer["outcome"] == f"ok: resume {held_flow}"
        if path.endswith("/pause"):
            assert answer["outcome"] == f"ok: pause {held_flow}"
            resumed = api.http.post(f"/api/flows/{held_flow}/resume", headers=basic("operator"))
            assert resumed.json()["outcome"] == f"ok: resume {held_flow}"
        if path.endswith("/drain"):
            assert answer["outcome"].startswith("draining")
            api.http.post("/api/node/undrain", headers=basic("operator")).raise_for_status()
        if path.endswith("/events"):
            assert "event: outcome" in response.text
    else:
        assert response.status_code == 403, response.text
        assert answer["error"].startswith(f"user {caller} may not")


# --- starts ---------------------------------------------------------------------------------


def test_a_started_flow_runs_and_its_outcome_is_json(api: Api) -> None:
    name = api.config.name
    body = {
        "class": TYPED,
        "args": {"party": name, "count": 3, "ratio": 1, "flag": True, "names": ["a", "b"]},
    }
    response = api.start(body, user="robot")
    assert response.status_code == 201, response.text
    started = response.json()
    assert started["class"] == TYPED and started["repeated"] is False
    assert started["links"]["events"] == f"/api/flows/{started['flow_id']}/events"
    done = api.finished(started["flow_id"])
    assert done["status"] == "COMPLETED"
    assert done["outcome"] == {"result": {"party": name, "count": 3, "names": ["a", "b"]}}


def test_a_client_request_id_starts_one_flow_and_a_different_body_is_409(api: Api) -> None:
    request_id = uuid.uuid4().hex
    body = {"class": STEPS, "args": {"steps": []}, "client_request_id": request_id}
    before = api.requests_written()
    first = api.start(body)
    again = api.start(body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["flow_id"] == again.json()["flow_id"]
    assert again.json()["repeated"] is True
    assert api.requests_written() == before + 1
    other = api.start({**body, "args": {"steps": ["x"]}})
    assert other.status_code == 409
    assert "client_request_id was used for another start" in other.json()["error"]
    other_class = api.start({**body, "class": TYPED, "args": {}})
    assert other_class.status_code in (400, 409)
    # the same request id of another user is another flow
    theirs = api.start(body, user="starter")
    assert theirs.status_code == 201 and theirs.json()["flow_id"] != first.json()["flow_id"]
    assert api.requests_written() == before + 2
    api.finished(first.json()["flow_id"])
    assert api.start(body).json()["flow_id"] == first.json()["flow_id"]  # also once finished


# --- bad input ------------------------------------------------------------------------------

BAD_STARTS = [
    ({"class": "no.such.Flow"}, 400, "no.such.Flow is not a flow of node"),
    ({"class": "samples.pingpong.flows.PongFlow"}, 403, "is a responder flow"),
    ({"class": "tests.rpc_cordapp.UnmarkedFlow"}, 403, "is not marked @startable_by_rpc"),
    ({"class": STEPS, "args": {}}, 400, "argument 'steps' is missing"),
    ({"class": STEPS, "args": {"steps": "abc"}}, 400, "argument 'steps': must be a list"),
    ({"class": STEPS, "args": {"steps": [1]}}, 400, "argument 'steps[0]': must be a string"),
    ({"class": STEPS, "args": {"steps": [], "more": 1}}, 400, "unknown argument 'more'"),
    ({"class": PING, "args": {"recipient": 7}}, 400, "must be a party's X.500 name"),
    (
        {
            "class": TYPED,
            "args": {"party": "O=A,L=B,C=GB", "count": -1, "ratio": 1.0, "flag": True, "names": []},
        },
        400,
        "the arguments do not build the flow: ValueError: count must not be negative",
    ),
    (
        {
            "class": TYPED,
            "args": {"party": "O=A,L=B,C=GB", "count": True, "ratio": 1.0, "flag": 1, "names": []},
        },
        400,
        "argument 'count': must be an integer, not a boolean",
    ),
    ({"class": STEPS, "args": [1]}, 400, "field 'args' must be an object"),
    ({"args": {}}, 400, "field 'class' must be"),
    ({"class": STEPS, "args": {"steps": []}, "colour": 1}, 400, "unknown field 'colour'"),
    ({"class": STEPS, "args": {"steps": []}, "client_request_id": ""}, 400, "client_request_id"),
    ([1, 2], 400, "the body must be a JSON object"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD_STARTS)
def test_a_bad_start_is_4xx_with_a_one_line_reason_and_writes_nothing(
    api: Api, body: Any, status: int, message: str
) -> None:
    before = api.requests_written()
    response = api.http.post("/api/flows", json=body, headers=basic("everything"))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error and "\n" not in error
    assert api.requests_written() == before


def test_malformed_json_and_oversized_bodies_are_refused(api: Api) -> None:
    before = api.requests_written()
    headers = {**basic("everything"), "content-type": "application/json"}
    broken = api.http.post("/api/flows", content=b'{"class": ', headers=headers)
    assert broken.status_code == 400 and broken.json()["error"].startswith("malformed JSON")
    huge = {"class": STEPS, "args": {"steps": ["x" * 1000] * 100}}
    too_big = api.http.post("/api/flows", content=json.dumps(huge).encode(), headers=headers)
    assert too_big.status_code == 413
    assert too_big.json()["error"] == "the body is larger than 65536 bytes"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"class": "' + b"x" * 40000
        yield b"y" * 40000 + b'"}'

    streamed = api.http.post("/api/flows", content=chunks(), headers=headers)
    assert streamed.status_code == 413
    assert api.requests_written() == before


def test_a_draining_node_refuses_starts_with_503(api: Api) -> None:
    drained = api.http.post("/api/node/drain", headers=basic("operator"))
    try:
        assert drained.status_code == 200
        assert api.http.get("/api/node", headers=basic("watcher")).json()["draining"] is True
        refused = api.start({"class": STEPS, "args": {"steps": []}})
        assert refused.status_code == 503 and "draining" in refused.json()["error"]
    finally:
        api.http.post("/api/node/undrain", headers=basic("operator")).raise_for_status()


# --- reading --------------------------------------------------------------------------------


def test_listing_filters_and_pages(api: Api, held_flow: str, done_flow: str) -> None:
    headers = basic("watcher")
    live = api.http.get("/api/flows", headers=headers).json()
    assert held_flow in [f["flow_id"] for f in live["flows"]]
    assert done_flow not in [f["flow_id"] for f in live["flows"]]
    everything = api.http.get("/api/flows?finished=true&limit=500", headers=headers).json()
    listed = {f["flow_id"]: f for f in everything["flows"]}
    assert listed[done_flow]["status"] == "COMPLETED" and listed[done_flow]["ended_at"]
    assert listed[held_flow]["class"] == STEPS and listed[held_flow]["progress_step"]
    ids = [f["flow_id"] for f in everything["flows"]]
    assert ids == sorted(ids) and everything["next"] is None
    completed = api.http.get("/api/flows?finished=true&status=completed", headers=headers).json()
    assert {f["status"] for f in completed["flows"]} == {"COMPLETED"}
    by_class = api.http.get("/api/flows?finished=true&class=TypedFlow", headers=headers).json()
    assert by_class["flows"] and {f["class"] for f in by_class["flows"]} == {TYPED}
    old = api.http.get("/api/flows?finished=true&min_age=86400", headers=headers).json()
    assert old["flows"] == []
    paged: list[str] = []
    after = ""
    while True:
        page = api.http.get(
            f"/api/flows?finished=true&limit=2&after={after}", headers=headers
        ).json()
        assert len(page["flows"]) <= 2
        paged += [f["flow_id"] for f in page["flows"]]
        if page["next"] is None:
            break
        after = page["next"]
    assert paged == ids
    for bad, problem in [
        ("limit=0", "'limit'"),
        ("min_age=soon", "'min_age' must be seconds"),
        ("finished=maybe", "'finished'"),
        ("colour=red", "unknown parameter 'colour'"),
    ]:
        response = api.http.get(f"/api/flows?{bad}", headers=headers)
        assert response.status_code == 400 and problem in response.json()["error"]


def test_one_live_flow_shows_its_step_and_what_it_waits_on(
    api: Api, held_flow: str, done_flow: str
) -> None:
    flow = api.http.get(f"/api/flows/{held_flow}", headers=bearer()).json()
    finished = api.http.get(f"/api/flows/{done_flow}", headers=bearer()).json()
    assert list(flow) == list(finished)  # one shape, whatever the flow's state
    assert flow["status"] == "SUSPENDED" and flow["progress_step"].startswith("held-")
    assert flow["progress_steps"] == [flow["progress_step"]]  # the steps so far, in order
    assert flow["waiting_on"].startswith("operation ")
    assert flow["outcome"] is None and flow["sessions"] == []
    assert flow["integrity"] == "MAC ok"
    missing = api.http.get("/api/flows/nope", headers=bearer())
    assert missing.status_code == 404 and missing.json()["error"].startswith("no flow nope")


def test_node_info_and_health(api: Api, held_flow: str) -> None:
    info = api.http.get("/api/node", headers=basic("watcher")).json()
    assert info["name"] == api.config.name and info["ready"] is True
    assert info["process"]["lease_held"] is True and info["process"]["partitions"]
    assert info["flows"]["live"] >= 1 and info["draining"] is False
    assert STEPS in info["startable"] and "samples.pingpong.flows.PongFlow" not in info["startable"]
    assert api.http.get("/health").json() == {"status": "alive"}
    assert api.http.get("/ready").json() == {"ready": True}
    unknown = api.http.get("/api/nothing")
    assert unknown.status_code == 404 and unknown.json()["error"] == "no route GET /api/nothing"


def test_an_operator_kills_a_live_flow(api: Api) -> None:
    response = api.start({"class": STEPS, "args": {"steps": ["to-kill-" + uuid.uuid4().hex]}})
    flow_id = response.json()["flow_id"]
    wait_until(
        lambda: (
            api.http.get(f"/api/flows/{flow_id}", headers=basic("watcher")).json()["status"]
            == "SUSPENDED"
        ),
        "the flow to wait at its gate",
    )
    killed = api.http.post(f"/api/flows/{flow_id}/kill", headers=basic("operator"))
    assert killed.status_code == 200 and killed.json()["outcome"] == f"ok: kill {flow_id}"
    done = api.finished(flow_id)
    assert done["status"] == "FAILED" and "killed" in done["outcome"]["error"]["message"]
    gate("unused")  # (the killed flow's gate is never opened)
