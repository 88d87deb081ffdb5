"""The API served by node processes: the progress stream, TLS, start-up failures, and a
flow started over HTTP between two real node processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from flows.config.rpc import RpcConfig
from flows.network.doorman import ROOT_CERTIFICATE_FILE, RootAuthority, new_tls_server_key
from flows.process.process import NodeProcess
from flows.rpc.gateway import request_flow_id
from foundation.engine import drop_schema
from statemachine.partitions import PARTITIONS, partition_of
from tests.conftest import POSTGRES_URL, postgres_problem, require_service
from tests.process.test_rpc_api import node_config, rpc_users
from tests.process.test_runtime import running, unique_name
from tests.rpc_cordapp import gate
from tests.rpc_helpers import basic, users_table, write_node_config
from tests.tls_broker import free_port
from tests.waiting import serving, still_running, wait_until

FIBERFLOW = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENT = {**os.environ, "PYTHONPATH": str(ROOT)}
"""Node processes run in their directory and import tests.rpc_cordapp from the checkout."""


def events(response: httpx.Response) -> Iterator[tuple[str, dict[str, Any]]]:
    """The server-sent events of a streaming response, as they arrive."""
    event = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[len("event: ") :]
        elif line.startswith("data: "):
            assert event is not None
            yield event, json.loads(line[len("data: ") :])
            event = None


@pytest.fixture(params=["sqlite", "postgresql"])
def database_schema(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None (SQLite), or a fresh schema of the tests' PostgreSQL, dropped afterwards."""
    if request.param == "sqlite":
        yield None
        return
    require_service("PostgreSQL", postgres_problem())
    schema = f"ff_rpc_{uuid.uuid4().hex[:8]}"
    try:
        yield schema
    finally:
        drop_schema(POSTGRES_URL, schema)


def test_the_progress_stream_delivers_each_step_and_the_outcome(
    tmp_path: Path, database_schema: str | None
) -> None:
    config = node_config(tmp_path, RpcConfig(port=0, users=rpc_users()), schema=database_schema)
    tag = uuid.uuid4().hex[:8]
    steps = [f"first {tag}", f"second {tag}"]
    with running([config]) as processes:
        server = processes[0].rpc_server
        assert server is not None
        with httpx.Client(base_url=server.url, timeout=60) as http:
            body = {"class": "tests.rpc_cordapp.StepsFlow", "args": {"steps": steps}}
            started = http.post("/api/flows", json=body, headers=basic("starter"))
            assert started.status_code == 201, started.text
            flow_id = started.json()["flow_id"]
            seen: list[str | None] = []
            url = f"/api/flows/{flow_id}/events"
            with http.stream("GET", url, headers=basic("watcher")) as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                for event, data in events(stream):
                    assert data["flow_id"] == flow_id
                    if event == "status":
                        step = data["progress_step"]
                        if step not in seen:
                            seen.append(step)
                        if step in steps:
                            gate(step).set()  # the flow goes on only once the step was seen
                    else:
                        assert event == "outcome"
                        assert data["status"] == "COMPLETED"
                        assert data["outcome"] == {"result": steps}
                        break
                else:
                    raise AssertionError("the stream ended without an outcome")
            assert [s for s in seen if s is not None] == steps
            listed = http.get("/api/flows?finished=true", headers=basic("watcher")).json()
            assert [(f["flow_id"], f["status"]) for f in listed["flows"]] == [
                (flow_id, "COMPLETED")
            ]
            info = http.get("/api/node", headers=basic("watcher")).json()
            assert info["flows"]["completed_kept"] == 1 and info["ready"] is True
            unknown = http.get("/api/flows/nope/events", headers=basic("watcher"))
            assert unknown.status_code == 404


@attrs.frozen
class Pki:
    root_file: Path
    certificate: Path
    key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("rpc-pki")
    root = RootAuthority.create(directory / "root", "CN=RPC Test Root,O=Fiberflow")
    key = new_tls_server_key()
    key_file = directory / "rpc.key.pem"
    key_file.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    key_file.chmod(0o600)
    certificate = directory / "rpc.cert.pem"
    issued = root.issue_tls_server(key.public_key(), ["localhost", "127.0.0.1"], 2)
    certificate.write_bytes(issued.public_bytes(Encoding.PEM))
    return Pki(directory / "root" / ROOT_CERTIFICATE_FILE, certificate, key_file)


def test_the_api_is_served_over_tls_with_the_configured_certificate(
    tmp_path: Path, pki: Pki
) -> None:
    rpc = RpcConfig(port=0, tls_certificate=pki.certificate, tls_key=pki.key, users=rpc_users())
    with running([node_config(tmp_path, rpc)]) as processes:
        server = processes[0].rpc_server
        assert server is not None and server.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(pki.root_file))
        with httpx.Client(base_url=server.url, verify=trusted, timeout=60) as http:
            assert http.get("/health").json() == {"status": "alive"}
            info = http.get("/api/node", headers=basic("watcher"))
            assert info.status_code == 200 and info.json()["ready"] is True
        plain = server.url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):  # no plain HTTP on a TLS port
            httpx.get(plain + "/health", timeout=10)
        untrusting = ssl.create_default_context()  # the system's roots: not ours
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(server.url + "/health", verify=untrusting, timeout=10)


def node_fields(tmp_path: Path, name: str | None = None) -> dict[str, Any]:
    short = uuid.uuid4().hex[:6]
    return {
        "name": name or unique_name("Alice"),
        "database_url": f"sqlite:///{short}.db",
        "transport_url": "sqlite:///queue.db",
        "cordapps": ["samples.pingpong", "tests.rpc_cordapp"],
        "key_file": f"{short}.key.pem",
        "status_file": f"{short}.status.json",
        "synchronous": "NORMAL",
    }


def node_run(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FIBERFLOW, "node", "run", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=config.parent,
        env=ENVIRONMENT,
    )


def one_error_line(done: subprocess.CompletedProcess[str], *words: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_an_address_in_use_is_a_one_line_start_up_failure(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_node_config(tmp_path / "alice.toml", node_fields(tmp_path), {"port": port})
        done = node_run(config)
    one_error_line(done, f"rpc: cannot listen on 127.0.0.1 port {port}", "refusing to start")


def test_a_bad_certificate_is_a_one_line_start_up_failure(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "broken.pem").write_text("not a certificate\n")
    rpc = {"port": 0, "tls_certificate": "broken.pem", "tls_key": str(pki.key)}
    config = write_node_config(tmp_path / "alice.toml", node_fields(tmp_path), rpc)
    one_error_line(node_run(config), "rpc: cannot load tls_certificate", "broken.pem")
    rpc = {"port": 0, "tls_certificate": str(pki.certificate), "tls_key": "missing.pem"}
    config = write_node_config(tmp_path / "alice.toml", node_fields(tmp_path), rpc)
    one_error_line(node_run(config), "rpc: cannot load tls_certificate", "missing.pem")


def test_a_worker_refuses_an_rpc_section_that_does_not_say_which_workers_serve(
    tmp_path: Path,
) -> None:
    config = write_node_config(tmp_path / "alice.toml", node_fields(tmp_path), {"port": 0})
    one_error_line(node_run(config, "--worker", "w1"), "rpc.worker_ports", "missing")


def test_two_node_processes_ping_over_http_and_stop_serving_on_sigterm(tmp_path: Path) -> None:
    """End to end: real processes, a real socket, PingFlow started by a token user."""
    port = free_port()
    alice_fields, bob_fields = node_fields(tmp_path), node_fields(tmp_path, unique_name("Bob"))
    rpc = {"port": port, "users": users_table()}
    alice = write_node_config(tmp_path / "alice.toml", alice_fields, rpc)
    bob = write_node_config(tmp_path / "bob.toml", bob_fields, None)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for config in (alice, bob):
            with config.with_suffix(".log").open("wb") as log:  # the child keeps its copy
                processes.append(
                    subprocess.Popen(
                        [*FIBERFLOW, "node", "run", "--config", str(config)],
                        cwd=tmp_path,
                        stdout=log,
                        stderr=log,
                        env=ENVIRONMENT,
                    )
                )
        for process, fields, config in zip(
            processes, (alice_fields, bob_fields), (alice, bob), strict=True
        ):
            wait_until(
                lambda p=process, f=fields: serving(tmp_path / f["status_file"], p),
                f"{config.name} to serve",
                90,
                check=still_running(process, config.with_suffix(".log")),
            )
        token = {"Authorization": "Bearer fft_the-token-of-the-robot-user-0123456789"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            wait_until(lambda: http.get("/ready").status_code == 200, "Alice's API to be ready")
            body = {
                "class": "samples.pingpong.flows.PingFlow",
                "args": {"recipient": bob_fields["name"]},
                "client_request_id": "ping-1",
            }
            started = http.post("/api/flows", json=body, headers=token)
            assert started.status_code == 201, started.text
            flow_id = started.json()["flow_id"]
            with http.stream("GET", f"/api/flows/{flow_id}/events", headers=token) as stream:
                outcome = [data for event, data in events(stream) if event == "outcome"]
            assert outcome == [
                {"flow_id": flow_id, "status": "COMPLETED", "outcome": {"result": "Pong"}}
            ]
            flow = http.get(f"/api/flows/{flow_id}", headers=token).json()
            assert flow["status"] == "COMPLETED" and flow["outcome"] == {"result": "Pong"}
            again = http.post("/api/flows", json=body, headers=token)
            assert again.status_code == 200 and again.json()["flow_id"] == flow_id
        processes[0].send_signal(signal.SIGTERM)
        assert processes[0].wait(60) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)


def test_of_a_node_s_workers_only_those_worker_ports_names_serve_and_answer_for_all(
    tmp_path: Path,
) -> None:
    require_service("PostgreSQL", postgres_problem())
    schema = f"ff_rpcw_{uuid.uuid4().hex[:8]}"
    rpc = RpcConfig(port=0, worker_ports={"w1": 0}, users=rpc_users())
    config = attrs.evolve(node_config(tmp_path, rpc, schema=schema), transport_url=POSTGRES_URL)
    workers = [NodeProcess(config, worker_name=name) for name in ("w1", "w2")]
    ended: dict[str, BaseException | int] = {}  # a worker's exit status, or what it raised

    def run(worker: NodeProcess) -> None:
        try:
            ended[str(worker.worker_name)] = worker.run(install_signal_handlers=False)
        except BaseException as error:
            ended[str(worker.worker_name)] = error
            raise

    def both_run() -> None:  # a worker that ended fails the test at once, naming why
        assert not ended, f"a worker ended: {ended}"

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    try:
        for thread in threads:
            thread.start()
        wait_until(
            lambda: all(w.lease is not None and w.node is not None for w in workers),
            "both workers to run",
            90,
            check=both_run,
        )
        serving_worker, silent_worker = workers
        assert serving_worker.rpc_server is not None and silent_worker.rpc_server is None
        with httpx.Client(base_url=serving_worker.rpc_server.url, timeout=60) as http:

            def settled() -> bool:  # a fair split of every partition: no more rebalancing
                shares = [sorted(w.node.partitions or ()) for w in workers if w.node]
                held = sorted(p for share in shares for p in share)
                return held == list(range(PARTITIONS)) and [len(s) for s in shares] == [8, 8]

            wait_until(settled, "the workers to share the partitions", 60, check=both_run)
            partitions = [set(w.node.partitions or ()) for w in workers if w.node is not None]
            request_ids: list[str] = []
            for worker_partitions in partitions:  # a start for each worker's partitions
                request_ids.append(
                    next(
                        f"order-{n}"
                        for n in range(10_000)
                        if f"order-{n}" not in request_ids
                        and partition_of(request_flow_id("starter", f"order-{n}"))
                        in worker_partitions
                    )
                )
            flow_ids = []
            for request_id in request_ids:
                body = {
                    "class": "tests.rpc_cordapp.StepsFlow",
                    "args": {"steps": []},
                    "client_request_id": request_id,
                }
                started = http.post("/api/flows", json=body, headers=basic("starter"))
                assert started.status_code == 201, started.text
                flow_ids.append(started.json()["flow_id"])
            for flow_id in flow_ids:
                wait_until(
                    lambda f=flow_id: (
                        http.get(f"/api/flows/{f}", headers=basic("watcher")).json()["status"]
                        == "COMPLETED"
                    ),
                    f"flow {flow_id} to complete",
                    60,
                )
            info = http.get("/api/node", headers=basic("watcher")).json()
            assert info["process"]["worker"] == "w1" and info["flows"]["completed_kept"] == 2
        started_by = [w.node.manager.statistics.flows_started for w in workers if w.node]
        assert started_by == [1, 1]  # each flow was started by the worker holding it
    finally:
        for worker in workers:
            worker.request_stop()
        for thread in threads:
            thread.join(60)
        drop_schema(POSTGRES_URL, schema)


def test_with_metrics_configured_the_api_serves_them_at_metrics_too(tmp_path: Path) -> None:
    from flows.config.runtime import MetricsSettings

    config = attrs.evolve(
        node_config(tmp_path, RpcConfig(port=0, users=rpc_users())),
        metrics=MetricsSettings(port=0),
    )
    with running([config]) as processes:
        server = processes[0].rpc_server
        assert server is not None
        scraped = httpx.get(server.url + "/metrics", timeout=60)
        assert scraped.status_code == 200
        assert "# TYPE fiberflow_checkpoint_commit_seconds histogram" in scraped.text
        assert "# TYPE fiberflow_flows_started_total counter" in scraped.text
