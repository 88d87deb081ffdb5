"""RpcClient against a real node process serving its HTTP API (one node for the module)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from flows.config.rpc import RpcConfig
from flows.config.runtime import RuntimeConfig
from flows.errors import FlowStillRunningError
from flows.node.client import FlowWaitTimeoutError, NodeClient
from flows.process.process import NodeProcess
from flows.rpc.client import RpcClient
from flows.rpc.client_errors import (
    RpcAuthenticationError,
    RpcBadRequestError,
    RpcConflictError,
    RpcConnectionError,
    RpcNotFoundError,
    RpcPermissionError,
    RpcUnavailableError,
)
from flows.tracebacks import FlowTraceback
from tests.process import test_rpc_process
from tests.process.test_rpc_api import node_config, rpc_users
from tests.process.test_runtime import running
from tests.rpc_cordapp import StepsFlow, gate
from tests.rpc_helpers import PASSWORDS, TOKEN
from tests.tls_broker import free_port

pki = test_rpc_process.pki  # the fixture: a root and the certificate it issued for 127.0.0.1


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProcess, RuntimeConfig]]:
    tmp_path = tmp_path_factory.mktemp("rpc-client")
    config = node_config(tmp_path, RpcConfig(port=0, users=rpc_users()))
    with running([config]) as processes:
        yield processes[0], config


def client_as(node: tuple[NodeProcess, RuntimeConfig], user: str, password: str | None = None):
    process, _ = node
    return RpcClient(
        process.rpc_server.url,
        user=user,
        password=PASSWORDS[user] if password is None else password,
        timeout=60,
    )


def opened(*steps: str) -> list[str]:
    for step in steps:
        gate(step).set()
    return list(steps)


def tagged(*names: str) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"{name} {tag}" for name in names]


def test_start_follow_the_progress_stream_and_get_the_result(node) -> None:
    steps = tagged("first", "second")
    with client_as(node, "everything") as client:
        started = client.start("tests.rpc_cordapp.StepsFlow", steps=steps)
        assert started.flow_class == "tests.rpc_cordapp.StepsFlow"
        assert not started.repeated and started.client_request_id is None
        seen: list[str] = []
        events: list[str] = []
        for event in client.progress(started.flow_id):
            events.append(event.kind)
            assert event.flow_id == started.flow_id
            if event.kind == "status" and event.progress_step in steps:
                if event.progress_step not in seen:
                    seen.append(event.progress_step)
                gate(event.progress_step).set()  # the flow goes on once the step was seen
        assert seen == steps
        assert events[-1] == "outcome" and "outcome" not in events[:-1]
        assert client.result(started.flow_id) == steps
        status = client.status(started.flow_id)
        assert status["status"] == "COMPLETED" and status["outcome"] == {"result": steps}


def test_wait_reports_progress_and_collects_every_outcome(node) -> None:
    first, second = opened(*tagged("a")), opened(*tagged("b"))
    with client_as(node, "everything") as client:
        ids = client.start_flows([StepsFlow(first)])
        ids.append(client.start_flow(StepsFlow(second), request_id=f"second-{uuid.uuid4()}"))
        calls: list[tuple[int, int]] = []
        outcomes = client.wait(ids, timeout=60, on_progress=lambda d, t: calls.append((d, t)))
        assert sorted(outcomes) == sorted(ids)
        assert [outcomes[i].value() for i in ids] == [first, second]
        assert calls[-1] == (2, 2) and all(total == 2 for _, total in calls)
        assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_a_failing_flow_raises_its_error_with_the_node_s_traceback(node) -> None:
    _, config = node
    with client_as(node, "everything") as client:
        started = client.start("tests.rpc_cordapp.BrokenFlow", item="widget")
        outcome = client.wait([started.flow_id], timeout=60)[started.flow_id]
        assert outcome.failed and outcome.status == "FAILED"
        with pytest.raises(KeyError) as raised:
            client.result(started.flow_id)
    cause = raised.value.__cause__
    assert isinstance(cause, FlowTraceback)
    assert "_price_of" in str(cause) and "KeyError" in str(cause)
    database_client = NodeClient(config.database_url)
    try:
        with pytest.raises(KeyError) as locally:
            database_client.result(started.flow_id)
    finally:
        database_client.close()
    assert locally.value.args == raised.value.args  # raised as the database client raises it
    assert str(locally.value.__cause__) == str(cause)


def test_a_client_request_id_makes_starts_idempotent(node) -> None:
    steps = opened(*tagged("once"))
    request = f"order-{uuid.uuid4()}"
    with client_as(node, "everything") as client:
        first = client.start("tests.rpc_cordapp.StepsFlow", client_request_id=request, steps=steps)
        again = client.start("tests.rpc_cordapp.StepsFlow", client_request_id=request, steps=steps)
        assert (first.repeated, again.repeated) == (False, True)
        assert again.flow_id == first.flow_id and again.client_request_id == request
        with pytest.raises(RpcConflictError) as conflict:
            client.start("tests.rpc_cordapp.StepsFlow", client_request_id=request, steps=["x"])
        assert conflict.value.status == 409 and "client_request_id" in conflict.value.reason
        assert client.wait([first.flow_id], 60)[first.flow_id].value() == steps


def test_each_refusal_is_its_rpc_error_with_the_server_s_reason(node) -> None:
    process, _ = node
    with client_as(node, "everything", password="wrong") as client:
        with pytest.raises(RpcAuthenticationError) as refused:
            client.node_info()
        assert refused.value.status == 401 and refused.value.reason
    with client_as(node, "starter") as client:
        with pytest.raises(RpcPermissionError) as refused:
            client.node_info()
        assert refused.value.reason == "user starter may not observe"
        with pytest.raises(RpcPermissionError, match="user starter may not start"):
            client.start("tests.rpc_cordapp.BrokenFlow", item="x")
    with client_as(node, "everything") as client:
        with pytest.raises(RpcPermissionError, match="is a responder flow"):
            client.start("samples.pingpong.flows.PongFlow")
        with pytest.raises(RpcBadRequestError) as bad:
            client.start("no.such.Flow")
        assert bad.value.status == 400 and "no.such.Flow is not a flow of node" in str(bad.value)
        with pytest.raises(RpcBadRequestError, match="argument 'steps'"):
            client.start("tests.rpc_cordapp.StepsFlow", steps=3)
        with pytest.raises(RpcNotFoundError, match="no flow nope"):
            client.status("nope")
        with pytest.raises(RpcNotFoundError):
            next(client.progress("nope"))
        with pytest.raises(RpcNotFoundError, match="no live flow nope"):
            client.kill("nope")
        assert client.drain().startswith("draining")
        try:
            with pytest.raises(RpcUnavailableError, match="draining"):
                client.start("tests.rpc_cordapp.StepsFlow", steps=[])
        finally:
            assert client.undrain().startswith("accepting")
    closed = RpcClient(f"http://127.0.0.1:{free_port()}", token=TOKEN, timeout=10)
    with closed, pytest.raises(RpcConnectionError) as unreachable:
        closed.health()
    assert unreachable.value.status is None
    with pytest.raises(ValueError, match="not both"):
        RpcClient(process.rpc_server.url, user="a", password="b", token=TOKEN)


def test_operate_a_flow_and_read_the_node(node) -> None:
    (held,) = tagged("held")  # its gate stays shut until the end
    with client_as(node, "everything") as client:
        flow_id = client.start("tests.rpc_cordapp.StepsFlow", steps=[held]).flow_id
        for event in client.progress(flow_id):
            if event.progress_step == held:
                break
        with pytest.raises(FlowStillRunningError):
            client.result(flow_id)
        with pytest.raises(FlowWaitTimeoutError, match="1 of 1 flows had not finished"):
            client.wait([flow_id], timeout=0.3)
        with pytest.raises(FlowWaitTimeoutError, match=f"flow {flow_id} had not finished"):
            list(client.progress(flow_id, timeout=0.5))
        with pytest.raises(RpcConflictError, match="not in the hospital"):
            client.retry(flow_id)
        assert client.pause(flow_id).startswith("ok")
        assert client.status(flow_id)["status"] == "PAUSED"
        assert client.resume(flow_id).startswith("ok")
        assert client.kill(flow_id).startswith("ok")
        gate(held).set()
        assert client.wait([flow_id], 60)[flow_id].failed
        assert client.health() and client.ready()
    process, config = node
    with RpcClient(process.rpc_server.url, token=TOKEN) as robot:
        info = robot.node_info()
        assert info["name"] == config.name and info["ready"] is True


def test_list_pages_through_the_flows_with_filters(node) -> None:
    with client_as(node, "everything") as client:
        ids = [
            client.start("tests.rpc_cordapp.StepsFlow", steps=opened(*tagged("listed"))).flow_id
            for _ in range(3)
        ]
        client.wait(ids, 60)
        pages = list(client.pages(finished=True, flow_class="StepsFlow", limit=1))
        assert all(len(page.flows) == 1 for page in pages[:-1])
        assert pages[-1].next is None
        paged = [flow["flow_id"] for page in pages for flow in page.flows]
        assert set(ids) <= set(paged) and paged == sorted(paged)
        listed = [f["flow_id"] for f in client.list(finished=True, status="COMPLETED", limit=2)]
        assert set(ids) <= set(listed)
        assert not set(ids) & {f["flow_id"] for f in client.list(status=["FAILED"])}
        with pytest.raises(RpcBadRequestError, match="'limit'"):
            client.page(limit=0)


def test_a_flow_instance_describes_the_start(node) -> None:
    steps = opened(*tagged("instance"))
    with client_as(node, "everything") as client:
        request = f"instance-{uuid.uuid4()}"
        flow_id = client.start_flow(StepsFlow(steps), request_id=request)
        assert client.start_flow(StepsFlow(steps), request_id=request) == flow_id
        assert client.wait([flow_id], 60)[flow_id].value() == steps


def test_the_client_imports_none_of_the_server_s_stack() -> None:
    """A client machine installs only httpx (the client extra): no Starlette, uvicorn, argon2."""
    code = (
        "import sys, flows.rpc.client, flows.cli.flow\n"
        "loaded = sorted(m for m in ('starlette', 'uvicorn', 'argon2') if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == ""


def test_https_with_the_node_s_private_root_as_the_ca_file(tmp_path, pki) -> None:
    rpc = RpcConfig(port=0, tls_certificate=pki.certificate, tls_key=pki.key, users=rpc_users())
    with running([node_config(tmp_path, rpc)]) as processes:
        url = processes[0].rpc_server.url
        assert url.startswith("https://")
        with RpcClient(url, token=TOKEN, verify=pki.root_file) as client:
            assert client.health() and client.node_info()["ready"] is True
        untrusting = RpcClient(url, token=TOKEN)  # the system's roots: not ours
        with untrusting, pytest.raises(RpcConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.health()
    with pytest.raises(ValueError, match="does not exist"):
        RpcClient(url, token=TOKEN, verify=tmp_path / "missing.pem")
