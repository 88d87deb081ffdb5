"""``fiberflow flow start`` and the ``--url`` side of the flow and node commands, against
real node processes (Alice serves the API; Bob answers PingFlow). One pair per module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from flows.cli.main import main
from flows.config.runtime import RuntimeConfig, load_config
from flows.process.process import NodeProcess
from flows.rpc.client import RpcClient
from tests.process.test_runtime import running, unique_name
from tests.rpc_cordapp import gate
from tests.rpc_helpers import PASSWORDS, users_table, write_node_config

ROOT = Path(__file__).resolve().parents[2]
FIBERFLOW = [sys.executable, "-m", "flows.cli"]
START_STEPS = ["flow", "start", "tests.rpc_cordapp.StepsFlow", "--arg"]
START_BROKEN = ["flow", "start", "tests.rpc_cordapp.BrokenFlow", "--arg", "item=widget", "--wait"]


@attrs.frozen
class Nodes:
    alice: NodeProcess
    config_file: Path
    config: RuntimeConfig
    bob_name: str

    @property
    def url(self) -> str:
        return str(self.alice.rpc_server.url)


def fields(directory: Path, name: str) -> dict[str, object]:
    short = uuid.uuid4().hex[:6]
    return {
        "name": name,
        "database_url": f"sqlite:///{directory / (short + '.db')}",
        "transport_url": f"sqlite:///{directory / 'queue.db'}",
        "cordapps": ["samples.pingpong", "tests.rpc_cordapp"],
        "network_map": str(directory / "network-map"),
        "key_file": str(directory / f"{short}.key.pem"),
        "synchronous": "NORMAL",
    }


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    directory = tmp_path_factory.mktemp("flow-start")
    alice_file = write_node_config(
        directory / "alice.toml",
        fields(directory, unique_name("Alice")),
        {"port": 0, "users": users_table()},
    )
    bob_name = unique_name("Bob")
    bob_file = write_node_config(directory / "bob.toml", fields(directory, bob_name), None)
    configs = [load_config(alice_file), load_config(bob_file)]
    with running(configs) as processes:
        yield Nodes(processes[0], alice_file, configs[0], bob_name)


def environment(**variables: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FIBERFLOW_")}
    return {**clean, "PYTHONPATH": str(ROOT), **variables}


def as_everything() -> dict[str, str]:
    return environment(FIBERFLOW_PASSWORD=PASSWORDS["everything"])


@attrs.frozen
class Done:
    code: int
    lines: list[str]
    stderr: str


def following(
    arguments: list[str], env: dict[str, str], gates: tuple[str, ...] | list[str] = ()
) -> Done:
    """Run the CLI; open each gate once the CLI has printed that step (so it saw it live)."""
    with subprocess.Popen(
        [*FIBERFLOW, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        lines = []
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            step = line.rstrip("\n").removeprefix("step: ")
            if line.startswith("step: ") and step in gates:
                gate(step).set()
        stderr = process.stderr.read()
        return Done(process.wait(120), lines, stderr)


def tagged(*names: str) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"{name} {tag}" for name in names]


def test_flow_start_wait_over_url_prints_each_step_then_the_result(nodes: Nodes) -> None:
    steps = tagged("checking", "booking")
    done = following(
        [
            "flow",
            "start",
            "tests.rpc_cordapp.StepsFlow",
            "--arg",
            f"steps={json.dumps(steps)}",
            "--wait",
            "--url",
            nodes.url,
            "--user",
            "everything",
        ],
        as_everything(),
        steps,
    )
    assert done.code == 0, done.stderr
    flow_id, *progress, result = done.lines
    assert not flow_id.startswith("rpc-")  # no request id: a random flow id
    assert progress == [f"step: {step}" for step in steps]
    assert json.loads(result) == steps


def test_flow_start_wait_over_config_with_a_party_argument(nodes: Nodes) -> None:
    done = following(
        [
            "flow",
            "start",
            "samples.pingpong.flows.PingFlow",
            "--arg",
            f"recipient={nodes.bob_name}",
            "--wait",
            "--request-id",
            f"ping-{uuid.uuid4()}",
            "--config",
            str(nodes.config_file),
        ],
        environment(),
    )
    assert done.code == 0, done.stderr
    assert done.lines[0].startswith("rpc-") and done.lines[-1] == '"Pong"'


def test_flow_start_wait_over_config_follows_the_steps(nodes: Nodes) -> None:
    steps = tagged("one", "two")
    arguments = [
        "flow",
        "start",
        "tests.rpc_cordapp.StepsFlow",
        "--arg",
        f"steps={json.dumps(steps)}",
        "--request-id",
        "same-request",
        "--config",
        str(nodes.config_file),
    ]
    done = following([*arguments, "--wait"], environment(), steps)
    assert done.code == 0, done.stderr
    assert done.lines[1:] == [*(f"step: {step}" for step in steps), json.dumps(steps)]
    again = following(arguments, environment())
    assert again.code == 0 and again.lines == done.lines[:1]
    assert "was used before" in again.stderr


def test_a_failing_flow_exits_1_with_its_error_line_and_flow_error_shows_the_traceback(
    nodes: Nodes, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    done = following(
        [*START_BROKEN, "--url", nodes.url, "--user", "everything"],
        as_everything(),
    )
    assert done.code == 1
    flow_id = done.lines[0]
    assert done.stderr.strip() == f"flow {flow_id} failed: KeyError: 'widget'"
    monkeypatch.setenv("FIBERFLOW_PASSWORD", PASSWORDS["everything"])
    assert main(["flow", "error", flow_id, "--url", nodes.url, "--user", "everything"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"flow {flow_id} (tests.rpc_cordapp.BrokenFlow) failed ")
    assert "builtins.KeyError: 'widget'" in out and "return prices[item]" in out
    assert main(["flow", "error", "nope", "--url", nodes.url, "--user", "everything"]) == 1
    assert "no failed flow nope" in capsys.readouterr().err
    rows = {}
    for way in (["--url", nodes.url, "--user", "everything"], ["--config", str(nodes.config_file)]):
        assert main(["flow", "list", "--json", *way]) == 0
        listed = json.loads(capsys.readouterr().out)["flows"]
        (rows[way[0]],) = [row for row in listed if row["flow_id"] == flow_id]
    keys = ("flow_id", "class", "status", "waiting_on", "step", "error", "error_class")
    assert [rows["--url"][k] for k in keys] == [rows["--config"][k] for k in keys]
    assert rows["--url"]["error"] == "KeyError: 'widget'"


def test_flow_list_kill_and_drain_over_url(
    nodes: Nodes, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (held,) = tagged("held")
    with RpcClient(nodes.url, user="everything", password=PASSWORDS["everything"]) as client:
        flow_id = client.start("tests.rpc_cordapp.StepsFlow", steps=[held]).flow_id
        for event in client.progress(flow_id):
            if event.progress_step == held:
                break
    monkeypatch.setenv("FIBERFLOW_PASSWORD", PASSWORDS["everything"])
    url = ["--url", nodes.url, "--user", "everything"]
    assert main(["flow", "list", *url]) == 0
    over_http = capsys.readouterr().out
    assert main(["flow", "list", "--config", str(nodes.config_file)]) == 0
    locally = capsys.readouterr().out
    row = next(line for line in over_http.splitlines() if line.startswith(flow_id))
    assert row.split()[1:3] == ["StepsFlow", "SUSPENDED"] and held in row
    assert over_http.splitlines()[0] == locally.splitlines()[0]  # the same table
    assert f"with a checkpoint on {nodes.config.name}" in over_http
    assert main(["flow", "list", "--json", "--all", *url]) == 0
    listed = {f["flow_id"]: f for f in json.loads(capsys.readouterr().out)["flows"]}
    assert listed[flow_id]["status"] == "SUSPENDED"
    assert main(["flow", "kill", flow_id, *url]) == 0
    assert capsys.readouterr().out.startswith("ok")
    gate(held).set()
    assert main(["flow", "kill", flow_id, *url]) == 1
    assert f"no live flow {flow_id}" in capsys.readouterr().err
    (late_step,) = tagged("late")  # its gate stays shut: the flow cannot end in time
    waiting = [*START_STEPS, f"steps={json.dumps([late_step])}", "--wait", "--timeout", "0.5"]
    assert main([*waiting, *url]) == 3
    late = capsys.readouterr()
    assert "had not finished after 0.5 s; it goes on" in late.err
    assert main(["flow", "kill", late.out.splitlines()[0], *url]) == 0
    gate(late_step).set()
    capsys.readouterr()
    assert main(["node", "drain", *url]) == 0
    assert capsys.readouterr().out.startswith("draining")
    assert main(["node", "undrain", *url]) == 0
    assert capsys.readouterr().out.startswith("accepting")


def one_line(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_bad_input_is_one_line_and_exit_2(
    nodes: Nodes, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    start = ["flow", "start", "tests.rpc_cordapp.StepsFlow"]
    url = ["--url", nodes.url, "--user", "everything"]
    monkeypatch.delenv("FIBERFLOW_PASSWORD", raising=False)
    monkeypatch.delenv("FIBERFLOW_TOKEN", raising=False)
    assert main([*start, "--arg", "steps=[]", *url]) == 2  # stdin is not a terminal
    one_line(capsys, "no password for user everything", "FIBERFLOW_PASSWORD")
    assert main([*start, "--arg", "steps=[]", "--url", nodes.url]) == 2
    one_line(capsys, "--url needs --user")
    monkeypatch.setenv("FIBERFLOW_PASSWORD", PASSWORDS["everything"])
    assert main([*start, "--arg", "steps", *url]) == 2
    one_line(capsys, "--arg 'steps' must be NAME=VALUE")
    assert main([*start, "--arg", "steps=[]", "--arg", "steps=[]", *url]) == 2
    one_line(capsys, "--arg steps is given twice")
    assert main([*start, "--arg", "steps=3", *url]) == 2
    one_line(capsys, "argument 'steps'")
    assert main([*start, "--arg", "steps=3", "--config", str(nodes.config_file)]) == 2
    one_line(capsys, "argument 'steps'")
    assert main([*start, "--arg", "stops=[]", *url]) == 2
    one_line(capsys, "stops")
    assert main(["flow", "start", "samples.pingpong.flows.PongFlow", *url]) == 2
    one_line(capsys, "responder")
    assert (
        main(
            ["flow", "start", "tests.rpc_cordapp.UnmarkedFlow", "--config", str(nodes.config_file)]
        )
        == 2
    )
    one_line(capsys, "not marked @startable_by_rpc")
    assert main([*start, "--arg", "steps=[]"]) == 2
    one_line(capsys, "give --config node.toml", "or --url URL")
    assert main([*start, "--config", str(nodes.config_file), *url]) == 2
    one_line(capsys, "not both")
    assert main(["flow", "list", "--config", str(nodes.config_file), "--user", "x"]) == 2
    one_line(capsys, "--user goes with --url")
    assert main(["flow", "list", "--url", nodes.url, "--user", "everything", "--token", "t"]) == 2
    one_line(capsys, "--user or --token, not both")
    monkeypatch.setenv("FIBERFLOW_PASSWORD", "wrong")
    assert main(["flow", "list", *url]) == 2
    one_line(capsys, "fiberflow flow list:")
