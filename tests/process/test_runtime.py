"""The node runtime: config checking, node processes over the SQL queue, flow requests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import pytest
from cryptography.hazmat.primitives import serialization

from flows.config.runtime import ConfigError, RuntimeConfig, load_config
from flows.errors import FlowFailedError
from flows.network.doorman import ROOT_CERTIFICATE_FILE, RootAuthority, certificate_request
from flows.network.identity import load_or_create_identity
from flows.network.map import NetworkMap, node_key
from flows.network.trust import NetworkRoot
from flows.node.client import NodeClient, decode_outcome
from flows.party import Party
from flows.process.process import EXIT_REFUSED, NodeProcess
from foundation.engine import drop_schema
from messaging.peer_senders import Credentials
from messaging.sqlqueue import SqlQueueBroker
from persistence.node_store import FlowRequest
from persistence.store import NodeDatabase
from samples.pingpong import PingFlow
from tests.conftest import POSTGRES_URL, postgres_problem, require_service
from tests.cordapp import SleepyFlow
from tests.waiting import serving, still_running, wait_until

FIBERFLOW = [sys.executable, "-m", "flows.cli"]


def unique_name(organisation: str) -> str:
    return f"O={organisation} {uuid.uuid4().hex[:8]},L=London,C=GB"


def toml_value(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def toml_key(key: str) -> str:
    """A bare key if TOML allows one, else a quoted key."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def write_config(path: Path, **fields: object) -> Path:
    lines = [f"{key} = {toml_value(value)}" for key, value in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def good_fields(tmp_path: Path) -> dict[str, object]:
    return {
        "name": "O=Alice,L=London,C=GB",
        "database_url": "sqlite:///alice.db",
        "transport_url": "sqlite:///queue.db",
        "cordapps": ["samples.pingpong"],
    }


def test_a_valid_config_resolves_paths_relative_to_its_file(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path / "alice.toml", **good_fields(tmp_path)))
    assert config.database_url == f"sqlite:///{tmp_path.resolve() / 'alice.db'}"
    assert config.transport_url == f"sqlite:///{tmp_path.resolve() / 'queue.db'}"
    assert config.network_map == tmp_path.resolve() / "network-map"
    assert config.cordapps == ("samples.pingpong",)
    assert config.receive_timeout == 3600.0


def test_limits_and_receive_timeout_come_from_the_config(tmp_path: Path) -> None:
    path = tmp_path / "alice.toml"
    write_config(path, **good_fields(tmp_path))
    with path.open("a") as config_file:
        config_file.write('receive_timeout = "forever"\nlimits = { max_depth = 8 }\n')
    config = load_config(path)
    assert config.receive_timeout is None
    assert config.limits.max_depth == 8 and config.limits.max_bytes == 16 * 1024 * 1024


def test_hibernation_settings_come_from_the_config(tmp_path: Path) -> None:
    path = tmp_path / "alice.toml"
    write_config(path, **good_fields(tmp_path))
    default = load_config(path)
    assert default.node_config().hibernate_after == 60.0
    assert default.node_config().memory_budget_mb is None
    with path.open("a") as config_file:
        config_file.write('hibernate_after = "never"\nmemory_budget_mb = 512\n')
    config = load_config(path).node_config()
    assert config.hibernate_after is None and config.memory_budget_mb == 512


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"name": None}, "name", "missing"),
        ({"databse_url": "sqlite:///x.db"}, "databse_url", "unknown field"),
        ({"name": "Alice"}, "name", ""),
        ({"transport_url": "http://127.0.0.1/"}, "transport_url", "unsupported transport"),
        ({"transport_url": "queue.db"}, "transport_url", "not a URL"),
        ({"database_url": "alice.db"}, "database_url", "not a URL"),
        ({"cordapps": ["no.such.module"]}, "cordapps", "cannot be imported"),
        ({"cordapps": "samples.pingpong"}, "cordapps", "must be a list"),
        ({"synchronous": "SOMETIMES"}, "synchronous", "must be OFF"),
        ({"database_schema": "alice"}, "database_schema", "PostgreSQL"),
        ({"log_level": "LOUD"}, "log_level", "must be DEBUG"),
        ({"limits": {"max_deepness": 3}}, "limits", "unknown limit 'max_deepness'"),
        ({"limits": {"max_depth": 0}}, "limits", "max_depth must be a positive int"),
        ({"limits": {"max_bytes": 1000}}, "limits", "max_bytes is 1000: session messages need"),
        ({"receive_timeout": -1}, "receive_timeout", "positive seconds"),
        ({"hibernate_after": "soon"}, "hibernate_after", 'positive seconds, or "never"'),
        ({"hibernate_after": -5}, "hibernate_after", "zero or positive seconds"),
        ({"memory_budget_mb": 0}, "memory_budget_mb", "at least 1"),
        ({"topology": "mesh"}, "topology", "must be shared or p2p"),
        ({"require_tls": True}, "require_tls", 'for topology = "p2p" only'),
        ({"former_inbounds": ["sqlite:///old.db"]}, "former_inbounds", "p2p"),
        (
            {"topology": "p2p", "former_inbounds": ["http://old/"]},
            "former_inbounds",
            "unsupported transport",
        ),
        (
            {"topology": "p2p", "former_inbounds": ["sqlite:///queue.db"]},
            "former_inbounds",
            "lists the current transport_url",
        ),
        (
            {"bridge_credentials": {"*": {"user": "a", "password": "b"}}},
            "bridge_credentials",
            'for topology = "p2p" only',
        ),
        (
            {"topology": "p2p", "bridge_credentials": {"Bob": {"user": "a", "password": "b"}}},
            "bridge_credentials.Bob",
            "not a node name",
        ),
        (
            {"topology": "p2p", "bridge_credentials": {"*": {"user": "a"}}},
            "bridge_credentials.*",
            "exactly 'user' and 'password'",
        ),
    ],
)
def test_a_bad_config_fails_naming_the_field(
    tmp_path: Path, change: dict[str, object], field: str, problem: str
) -> None:
    fields = {**good_fields(tmp_path), **change}
    fields = {k: v for k, v in fields.items() if v is not None}
    path = write_config(tmp_path / "node.toml", **fields)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert f"field {field!r}" in str(raised.value)
    assert problem in str(raised.value)
    assert str(path) in str(raised.value)


def test_a_p2p_config_reads_its_credentials_and_former_inbounds(tmp_path: Path) -> None:
    path = tmp_path / "alice.toml"
    write_config(path, **good_fields(tmp_path), topology="p2p", require_tls=True)
    with path.open("a") as config_file:
        config_file.write(
            'former_inbounds = ["sqlite:///old-inbound.db"]\n'
            '[bridge_credentials."O=Bob,L=New York,C=US"]\nuser = "alice"\npassword = "pw"\n'
            '[bridge_credentials."*"]\nuser = "anyone"\npassword = "pw2"\n'
        )
    config = load_config(path)
    assert (config.topology, config.require_tls) == ("p2p", True)
    assert config.former_inbounds == (f"sqlite:///{tmp_path.resolve() / 'old-inbound.db'}",)
    assert config.bridge_credentials == {
        "O=Bob,L=New York,C=US": Credentials("alice", "pw"),
        "*": Credentials("anyone", "pw2"),
    }


def test_a_config_that_is_not_toml_fails_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("name = [unclosed\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path)


def test_node_run_with_a_bad_config_exits_2_and_names_the_field(tmp_path: Path) -> None:
    path = write_config(tmp_path / "node.toml", **{**good_fields(tmp_path), "transport_url": "x"})
    done = subprocess.run(
        [*FIBERFLOW, "node", "run", "--config", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "field 'transport_url'" in done.stderr


# --- node processes in threads --------------------------------------------------------------


@contextmanager
def running(configs: list[RuntimeConfig]) -> Iterator[list[NodeProcess]]:
    processes = [NodeProcess(config) for config in configs]
    errors: list[str] = []

    def run(process: NodeProcess) -> None:
        try:
            process.run(install_signal_handlers=False)
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=run, args=(p,)) for p in processes]
    for thread in threads:
        thread.start()
    try:
        # Serving once each node published its node-info (a flow started for a party the
        # network map does not know yet fails at once: UnknownPartyError) and built its node
        # (it publishes first, then starts).
        wait_until(
            lambda: (
                errors
                or all(
                    _published(config) and process.node is not None
                    for config, process in zip(configs, processes, strict=True)
                )
                or not all(thread.is_alive() for thread in threads)
            ),
            "every node to publish its node-info and start",
            60,
        )
        yield processes
    finally:
        for process in processes:
            process.request_stop()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
        assert not errors, "\n".join(errors)


def _published(config: RuntimeConfig) -> bool:
    directory = config.network_map or Path("network-map")
    return (directory / f"{node_key(config.name)}.json").exists()


def two_nodes(tmp_path: Path, backend: str) -> tuple[RuntimeConfig, RuntimeConfig, list[str]]:
    alice, bob = unique_name("Alice"), unique_name("Bob")
    schemas: list[str] = []
    configs = []
    for name in (alice, bob):
        short = Party(name).organisation.split()[0].lower()
        if backend == "postgresql":
            require_service("PostgreSQL", postgres_problem())
            schema = f"ff_rt_{short}_{uuid.uuid4().hex[:8]}"
            schemas.append(schema)
            database, transport = POSTGRES_URL, POSTGRES_URL
        else:
            schema = None
            database = f"sqlite:///{tmp_path / (short + '.db')}"
            transport = f"sqlite:///{tmp_path / 'queue.db'}"
        configs.append(
            RuntimeConfig(
                name=name,
                database_url=database,
                transport_url=transport,
                cordapps=("samples.pingpong", "tests.cordapp"),
                network_map=tmp_path / "network-map",
                database_schema=schema,
                synchronous="NORMAL",
                status_file=tmp_path / f"{short}.status.json",
                key_file=tmp_path / f"{short}.key.pem",
            )
        )
    return configs[0], configs[1], schemas


def client_of(config: RuntimeConfig) -> NodeClient:
    """A client of the node ``config`` describes, whose process may not have run yet.

    A client only opens an existing node database, so the database is made first as the
    node makes it when it first runs (``NodeDatabase`` creating it).
    """
    NodeDatabase(config.database_url, schema_name=config.database_schema).close()
    return NodeClient(config.database_url, database_schema=config.database_schema)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_two_node_processes_ping_pong_over_the_sql_queue(tmp_path: Path, backend: str) -> None:
    alice, bob, schemas = two_nodes(tmp_path, backend)
    client = client_of(alice)
    try:
        broker = SqlQueueBroker(alice.transport_url)
        with running([alice, bob]) as processes:
            flow_ids = client.start_flows([PingFlow(Party(bob.name)) for _ in range(30)])
            outcomes = client.wait(flow_ids, timeout=60)
            assert [decode_outcome(outcomes[f]) for f in flow_ids] == ["Pong"] * 30
            assert {p.node.party.name for p in processes if p.node} == {alice.name, bob.name}
            # The last messages (ends of sessions) are still travelling: the network drains.
            wait_until(
                lambda: (
                    not (
                        broker.depth(alice.name)
                        or broker.depth(bob.name)
                        or client.database.count("node_outbox")
                    )
                ),
                "the queues and Alice's outbox to drain",
                30,
            )
        assert set(NetworkMap(tmp_path / "network-map").nodes()) == {alice.name, bob.name}
        status = json.loads((tmp_path / "bob.status.json").read_text())
        assert status["flows_completed"] == 30 and status["running"] is False
        assert client.database.count("node_outbox") == 0
        assert client.database.count("node_checkpoints") == 0
        broker.purge(alice.name)
        broker.purge(bob.name)
        broker.close()
    finally:
        client.close()
        for schema in schemas:
            drop_schema(POSTGRES_URL, schema)


def test_a_flow_request_is_started_once_and_an_unknown_class_fails_with_the_reason(
    tmp_path: Path,
) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    client = client_of(alice)
    try:
        flow = SleepyFlow(0.01)
        first = client.start_flow(flow, request_id="request-1")
        again = client.start_flow(flow, request_id="request-1")
        assert first == again == "request-1"
        bogus = FlowRequest("request-2", "no.such.module.Flow", b"\x92\x90\x80")
        client.database.control.request_flows([bogus], time.time())
        with running([alice, bob]):
            outcomes = client.wait(["request-1", "request-2"], timeout=60)
        assert decode_outcome(outcomes["request-1"]) >= 0.01
        with pytest.raises(FlowFailedError, match="not a flow in this node's CorDapps"):
            decode_outcome(outcomes["request-2"])
        status = json.loads((tmp_path / "alice.status.json").read_text())
        assert status["flows_started"] == 1
    finally:
        client.close()


# --- nodes under a network trust root ------------------------------------------------------


def certify(configs: list[RuntimeConfig], tmp_path: Path) -> list[RuntimeConfig]:
    """The configs with the network root and a certificate each (from their key files)."""
    authority = RootAuthority.create(tmp_path / "root")
    certified = []
    for config in configs:
        assert config.key_file is not None
        identity = load_or_create_identity(config.key_file, config.name)
        certificate = authority.issue(certificate_request(identity))
        path = config.key_file.with_suffix(".cert")
        path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        certified.append(
            attrs.evolve(
                config, network_root=tmp_path / "root" / ROOT_CERTIFICATE_FILE, certificate=path
            )
        )
    return certified


def test_nodes_under_a_root_publish_certified_node_infos_and_ping_pong(tmp_path: Path) -> None:
    alice, bob = certify(list(two_nodes(tmp_path, "sqlite")[:2]), tmp_path)
    client = client_of(alice)
    try:
        with running([alice, bob]):
            outcome = client.wait([client.start_flow(PingFlow(Party(bob.name)))], timeout=60)
            assert [decode_outcome(o) for o in outcome.values()] == ["Pong"]
    finally:
        client.close()
    root = NetworkRoot.load(tmp_path / "root" / ROOT_CERTIFICATE_FILE)
    rooted = NetworkMap(tmp_path / "network-map", root)
    assert set(rooted.nodes()) == {alice.name, bob.name} and rooted.rejected() == []


def test_a_node_whose_certificate_does_not_match_refuses_to_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alice, bob = certify(list(two_nodes(tmp_path, "sqlite")[:2]), tmp_path)
    wrong = attrs.evolve(alice, certificate=bob.certificate)  # Bob's certificate
    assert NodeProcess(wrong).run(install_signal_handlers=False) == EXIT_REFUSED
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith(f"{alice.name}: node certificate {bob.certificate} is not valid")
    assert f"certificate is for {bob.name}, not {alice.name}" in line
    assert line.endswith("refusing to start")
    assert not (tmp_path / "alice.db").exists()  # refused before opening anything
    caplog.clear()
    missing = attrs.evolve(alice, certificate=tmp_path / "missing.pem")
    assert NodeProcess(missing).run(install_signal_handlers=False) == EXIT_REFUSED
    assert "missing.pem: cannot read it" in caplog.records[-1].getMessage()


# --- real processes -----------------------------------------------------------------------


def test_a_node_process_shuts_down_cleanly_on_sigterm(tmp_path: Path) -> None:
    path = write_config(tmp_path / "alice.toml", **good_fields(tmp_path))
    log = tmp_path / "alice.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*FIBERFLOW, "node", "run", "--config", str(path)], stdout=output, stderr=output
        )
    network_map = NetworkMap(tmp_path / "network-map")
    try:  # a node publishes its node info once it has started
        wait_until(
            lambda: network_map.lookup("O=Alice,L=London,C=GB") is not None,
            "Alice to start and publish her node info",
            check=still_running(process, log),
        )
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert "received SIGTERM" in text and "stopped cleanly" in text
    assert NetworkMap(tmp_path / "network-map").lookup("O=Alice,L=London,C=GB") is not None


@pytest.mark.slow
def test_the_demo_runs_two_node_processes(tmp_path: Path) -> None:
    done = subprocess.run(
        [*FIBERFLOW, "demo", "--flows", "20", "--directory", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all flows returned 'Pong'" in done.stdout
    assert "nodes exited with [0, 0]" in done.stdout


@pytest.mark.slow
def test_the_p2p_demo_gives_each_node_its_own_inbound_and_a_certificate(tmp_path: Path) -> None:
    done = subprocess.run(
        [*FIBERFLOW, "demo", "--topology", "p2p", "--flows", "20", "--directory", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all flows returned 'Pong'" in done.stdout
    assert not (tmp_path / "queue.db").exists()  # no shared queue file
    root = NetworkRoot.load(tmp_path / "network-root" / ROOT_CERTIFICATE_FILE)
    infos = NetworkMap(tmp_path / "network-map", root).scan()
    assert infos.rejected == ()
    inbounds = {info.name: info.transport for _, info in infos.accepted}
    assert inbounds == {
        "O=Alice,L=London,C=GB": f"sqlite:///{tmp_path / 'alice-inbound.db'}",
        "O=Bob,L=New York,C=US": f"sqlite:///{tmp_path / 'bob-inbound.db'}",
    }


def test_the_p2p_demo_refuses_a_shared_transport() -> None:
    done = subprocess.run(
        [*FIBERFLOW, "demo", "--topology", "p2p", "--transport", "sqlite:///q.db"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "each node an inbound of its own" in done.stderr


def test_a_killed_node_process_resumes_its_flows_after_restart(tmp_path: Path) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    paths = []
    for config in (alice, bob):
        short = Party(config.name).organisation.split()[0].lower()
        paths.append(
            write_config(
                tmp_path / f"{short}.toml",
                name=config.name,
                database_url=config.database_url,
                transport_url=config.transport_url,
                cordapps=list(config.cordapps),
                status_file=f"{short}.status.json",
            )
        )
    logs = [tmp_path / "alice.log", tmp_path / "bob.log"]

    def start(index: int) -> subprocess.Popen[bytes]:
        with logs[index].open("ab") as output:
            return subprocess.Popen(
                [*FIBERFLOW, "node", "run", "--config", str(paths[index])],
                stdout=output,
                stderr=output,
            )

    client = client_of(alice)
    bobs: NodeClient | None = None  # opened once Bob's process has made his database
    statuses = [tmp_path / "alice.status.json", tmp_path / "bob.status.json"]

    def wait_serving(index: int) -> None:
        wait_until(
            lambda: serving(statuses[index], processes[index]),
            f"{('Alice', 'Bob')[index]} to start",
            check=still_running(processes[index], logs[index]),
        )

    # Bob joins the network (his node-info is published), then stops: Alice may start flows
    # for him (a party the map does not know would fail at once), and while he is down their
    # messages wait in his queue.
    joined = start(1)
    wait_until(
        lambda: serving(statuses[1], joined), "Bob to join", check=still_running(joined, logs[1])
    )
    joined.send_signal(signal.SIGTERM)
    assert joined.wait(60) == 0
    processes = [start(0)]
    try:
        wait_serving(0)
        flow_ids = client.start_flows([PingFlow(Party(bob.name)) for _ in range(40)])
        processes.append(start(1))
        wait_serving(1)
        bobs = client_of(bob)
        wait_until(  # killed in the middle of his work, not before it
            lambda: bobs.database.count("node_message_ids") > 0,
            "Bob to take in a first message",
            check=still_running(processes[1], logs[1]),
        )
        os.kill(processes[1].pid, signal.SIGKILL)
        processes[1].wait(30)
        processes[1] = start(1)
        wait_serving(1)  # restarted (its flows may all be done already: it must start anyway)
        outcomes = client.wait(flow_ids, timeout=120)
        assert [decode_outcome(outcomes[f]) for f in flow_ids] == ["Pong"] * 40
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
        client.close()
        if bobs is not None:
            bobs.close()
    assert logs[1].read_text().count("started (pid") == 3  # joined, ran, restarted
