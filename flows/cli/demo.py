"""``fiberflow demo``: ping/pong between Alice and Bob.

By default the two nodes are separate processes (``fiberflow node run``) on the embedded
durable default: a SQLite database each and the SQL queue in a shared SQLite file. The demo
writes their configs into a directory, starts them, asks Alice (through her database) to
start N ``PingFlow``s to Bob, shows progress until every flow has finished, stops both nodes
with SIGTERM and prints a summary. ``--transport`` and ``--database`` run the same demo on
RabbitMQ and PostgreSQL; ``--in-process`` runs both nodes in this process on the in-memory
test network and prints every checkpoint written.

``--topology p2p`` runs the peer-to-peer network instead (docs/network.md): each node owns its
inbound (a SQL queue file of its own), publishes it in the network map and reaches the other
through a bridge; the demo makes a network trust root and issues each node its certificate,
so each node trusts only the other's certified, signed node-info.

The demo's CorDapp is data, as in a node config's ``cordapps``: a module name
(:data:`DEMO_CORDAPP`) and the qualified name of its initiating flow (:data:`DEMO_FLOW`), loaded
by name at run time. No framework module imports a sample.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs

from flows.cli.progress import ProgressBar
from flows.cordapps import CordappError, Cordapps
from flows.flow_logic import FlowLogic
from flows.node.client import NodeClient, decode_outcome
from flows.party import Party
from flows.process.command import startup_problem
from flows.testing import MockNetwork
from foundation.engine import drop_schema
from messaging.transports import purge_queues
from statemachine.state import Checkpoint

log = logging.getLogger("fiberflow.demo")

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"
STOP_TIMEOUT_SECONDS = 30.0
DEMO_CORDAPP = "samples.pingpong"
"""The CorDapp both demo nodes install (a module name, as in a node config's ``cordapps``)."""
DEMO_FLOW = "samples.pingpong.flows.PingFlow"
"""The initiating flow the demo starts on Alice, built with Bob's ``Party`` as its argument."""
DEMO_REPLY = "Pong"
"""What every demo flow returns when all went well."""


class DemoNodeDiedError(RuntimeError):
    """A node process of the demo exited before the flows finished."""


class DemoStartError(DemoNodeDiedError):
    """A node process of the demo exited before it started serving.

    The message is the one line it gave as its reason (a database or broker it cannot use).
    """


def demo_flows(count: int, counterparty: Party) -> list[FlowLogic[Any]]:
    """``count`` instances of :data:`DEMO_FLOW` to ``counterparty``, loaded from its CorDapp."""
    # Any: this flow's constructor takes the counterparty, FlowLogic's takes nothing.
    flow_class: Any = Cordapps([DEMO_CORDAPP]).flow_class(DEMO_FLOW)
    if flow_class is None:
        raise CordappError(f"the demo flow {DEMO_FLOW} is not in the CorDapp {DEMO_CORDAPP}")
    return [flow_class(counterparty) for _ in range(count)]


def _describe_checkpoint(node: str, checkpoint: Checkpoint, size: int) -> str:
    pending = checkpoint.pending
    waiting = ""
    if pending is not None:
        waiting = f", waiting on {pending.request.describe()}"
    flow = checkpoint.flow_class.rsplit(".", 1)[-1]
    return (
        f"  checkpoint  {node:<6} {flow:<9} {checkpoint.flow_id[:8]}  "
        f"{checkpoint.status.value:<9} journal={len(checkpoint.journal)} "
        f"bytes={size}{waiting}"
    )


def run_in_process_demo(flows: int, directory: Path | None, verbose: bool) -> int:
    """Ping/pong between Alice and Bob in one process; print results and checkpoints."""
    with MockNetwork(cordapps=[DEMO_CORDAPP], directory=directory, synchronous="FULL") as network:
        alice = network.create_node(ALICE)
        bob = network.create_node(BOB)
        print(f"fiberflow demo: {flows} ping/pong flow(s) between {ALICE} and {BOB}")
        print(f"  databases:  {network.directory} (SQLite, WAL, synchronous=FULL)")
        print("  transport:  in-process memory network (test double)")
        show = verbose or flows <= 3
        for mock in (alice, bob):
            short = mock.party.organisation

            def listener(checkpoint: Checkpoint, size: int, short: str = short) -> None:
                if show:
                    print(_describe_checkpoint(short, checkpoint, size))

            mock.node.database.checkpoints.checkpoint_listeners.append(listener)
        started = time.perf_counter()
        handles = [alice.start_flow(flow) for flow in demo_flows(flows, bob.party)]
        rounds = network.run_network()
        elapsed = time.perf_counter() - started
        results = [h.result() for h in handles]
        for handle, result in list(zip(handles, results, strict=True))[:3]:
            print(f"  result      PingFlow {handle.flow_id[:8]} -> {result!r}")
        if len(results) > 3:
            print(f"  ... {len(results) - 3} more results")
        ok = results == [DEMO_REPLY] * flows
        written = sum(m.node.database.checkpoints.checkpoints_written for m in (alice, bob))
        sent = network.messaging.statistics.sent
        left = len(alice.checkpoints()) + len(bob.checkpoints())
        print(
            f"  summary     {flows} flows in {elapsed:.3f} s ({flows / elapsed:,.0f} flows/s), "
            f"{rounds} rounds, {written} checkpoints written, {sent} messages sent, "
            f"{left} checkpoints left"
        )
        print(f"  all flows returned {DEMO_REPLY!r}" if ok else "  SOME FLOWS FAILED")
        return 0 if ok and left == 0 else 1


Launcher = Callable[[str], list[str]]
"""The command that runs ``fiberflow`` for a demo node (given its short name), without the
``node run --config ...`` that follows: a benchmark may run the node under a wrapper."""


def _cli_launcher(_: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli"]


class _DemoNode:
    def __init__(
        self,
        name: str,
        directory: Path,
        database_url: str | None,
        transport: str,
        extra_lines: tuple[str, ...] = (),
        launcher: Launcher | None = None,
    ):
        self.name = name
        self.transport = transport
        self.short = Party(name).organisation.lower()
        self.schema: str | None = None
        if database_url is None:
            self.database_url = f"sqlite:///{directory / (self.short + '.db')}"
        else:
            self.database_url = database_url
            self.schema = f"ffdemo_{self.short}_{uuid.uuid4().hex[:8]}"
        self.config_path = directory / f"{self.short}.toml"
        self.log_path = directory / f"{self.short}.log"
        self.status_path = directory / f"{self.short}.status.json"
        lines = [
            f"name = {json.dumps(name)}",
            f"database_url = {json.dumps(self.database_url)}",
            f"transport_url = {json.dumps(transport)}",
            f"cordapps = {json.dumps([DEMO_CORDAPP])}",
            'network_map = "network-map"',
            f"status_file = {json.dumps(self.status_path.name)}",
        ]
        if self.schema is not None:
            lines.append(f"database_schema = {json.dumps(self.schema)}")
        lines.extend(extra_lines)
        self.config_path.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[bytes] | None = None
        self.launcher = launcher or _cli_launcher

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    *self.launcher(self.short),
                    "node",
                    "run",
                    "--config",
                    str(self.config_path),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_started(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.status().get("running"):
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                raise DemoStartError(
                    f"node {self.name} could not start (exit {code}): {self.last_log_line()} "
                    f"(its log: {self.log_path})"
                )
            if time.monotonic() > deadline:
                raise DemoNodeDiedError(f"node {self.name} did not start within {timeout:.0f} s")
            time.sleep(0.02)

    def last_log_line(self) -> str:
        """The last line the node wrote (a node that cannot start says why in it)."""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return lines[-1].strip() if lines else "(its log is empty)"

    def check_alive(self) -> None:
        assert self.process is not None
        code = self.process.poll()
        if code is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-15:]
            raise DemoNodeDiedError(
                f"node {self.name} exited with code {code}; the end of {self.log_path}:\n"
                + "\n".join(tail)
            )

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def status(self) -> dict[str, Any]:
        try:
            document: dict[str, Any] = json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}
        return document


@attrs.frozen
class PingPongRun:
    """What a two-process ping/pong run measured."""

    flows: int
    seconds: float
    """From the flow requests' commit to the last outcome (nodes already started)."""
    results: tuple[Any, ...]
    checkpoints_written: int
    messages_sent: int
    completed: tuple[int, int]
    exit_codes: tuple[int | None, int | None]

    @property
    def ok(self) -> bool:
        """Every flow returned :data:`DEMO_REPLY` and both nodes stopped cleanly."""
        return self.results == (DEMO_REPLY,) * self.flows and self.exit_codes == (0, 0)


def run_pingpong_processes(
    flows: int,
    workdir: Path,
    transport: str,
    database_url: str | None,
    timeout: float | None = None,
    show_progress: bool = True,
    announce: bool = False,
    topology: str = "shared",
    launcher: Launcher | None = None,
    on_phase: Callable[[str, list[int]], None] | None = None,
) -> PingPongRun:
    """Start Alice and Bob as processes, run ``flows`` ping/pongs, stop them; measure.

    With ``topology="p2p"`` ``transport`` is ignored: each node gets an inbound of its own
    (a SQL queue file in ``workdir``) and a certificate from a network root made there.
    ``launcher`` gives the command that runs ``fiberflow`` for each node (default: this
    interpreter, ``-m flows.cli``); ``on_phase`` is called with ``"start"`` just before the
    flow requests are committed and ``"end"`` once every outcome is in, with the nodes'
    process ids (a benchmark takes its counters' readings then).
    """
    if topology == "p2p":
        alice, bob = _p2p_nodes(workdir, database_url, launcher)
    else:
        alice = _DemoNode(ALICE, workdir, database_url, transport, launcher=launcher)
        bob = _DemoNode(BOB, workdir, database_url, transport, launcher=launcher)
    if announce:
        print(f"  directory:  {workdir} (configs, logs, status files)")
        print(
            f"  databases:  {alice.database_url if database_url is None else database_url}"
            + ("" if database_url is None else f" (schemas {alice.schema}, {bob.schema})")
        )
        if topology == "p2p":
            print(f"  topology:   peer to peer; Alice's inbound {alice.transport}")
            print(f"              Bob's inbound {bob.transport}; bridges between them")
            print(
                f"  trust root: {workdir / 'network-root'} (each node's certificate issued by it)"
            )
        else:
            print(f"  transport:  {transport}")
    client: NodeClient | None = None
    serving = False
    try:
        for node in (alice, bob):
            node.start()
        for node in (alice, bob):
            node.wait_started()
        serving = True
        client = NodeClient(alice.database_url, database_schema=alice.schema)
        pids = [node.process.pid for node in (alice, bob) if node.process is not None]
        if on_phase is not None:
            on_phase("start", pids)
        started = time.perf_counter()
        flow_ids = client.start_flows(demo_flows(flows, Party(BOB)))
        bar = ProgressBar(flows, "flows") if show_progress else None

        def progress(done: int, total: int) -> None:
            if bar is not None:
                bar.update(done)
            for node in (alice, bob):
                node.check_alive()

        outcomes = client.wait(flow_ids, timeout or max(120.0, flows * 0.2), progress)
        elapsed = time.perf_counter() - started
        if on_phase is not None:
            on_phase("end", pids)
        if bar is not None:
            bar.finish()
        results = tuple(decode_outcome(outcomes[f]) for f in flow_ids)
        codes = (alice.stop(), bob.stop())
        statuses = [node.status() for node in (alice, bob)]
        return PingPongRun(
            flows=flows,
            seconds=elapsed,
            results=results,
            checkpoints_written=sum(s.get("checkpoints_written", 0) for s in statuses),
            messages_sent=sum(s.get("messages_sent", 0) for s in statuses),
            completed=(
                statuses[0].get("flows_completed", 0),
                statuses[1].get("flows_completed", 0),
            ),
            exit_codes=codes,
        )
    finally:
        for node in (alice, bob):
            node.stop()
        if client is not None:
            client.close()
        _clean_up(alice, bob, database_url, purge=serving)


def _clean_up(alice: _DemoNode, bob: _DemoNode, database_url: str | None, purge: bool) -> None:
    """Drop the nodes' schemas and (with ``purge``: they ran) empty their queues.

    A failure here is one warning line: after a failed start the database or broker may be
    the very thing that cannot be reached, and the start's own error is the one to report.
    """
    steps: list[tuple[str, Callable[[], None]]] = []
    for node in (alice, bob):
        if database_url is not None and node.schema is not None:
            steps.append(
                (f"drop schema {node.schema}", partial(drop_schema, database_url, node.schema))
            )
        if purge:
            steps.append(
                (f"purge {node.name}'s queues", partial(purge_queues, node.transport, [node.name]))
            )
    for what, step in steps:
        try:
            step()
        except Exception as error:
            log.warning("fiberflow demo: could not %s: %s", what, startup_problem(error))


def _p2p_nodes(
    workdir: Path, database_url: str | None, launcher: Launcher | None = None
) -> tuple[_DemoNode, _DemoNode]:
    """Alice and Bob of the peer-to-peer demo: own inbounds, certified by a network root."""
    from cryptography.hazmat.primitives.serialization import Encoding

    from flows.network.doorman import ROOT_CERTIFICATE_FILE, RootAuthority, certificate_request
    from flows.network.identity import load_or_create_identity
    from flows.network.map import node_key

    root_directory = workdir / "network-root"
    if (root_directory / ROOT_CERTIFICATE_FILE).exists():
        root = RootAuthority.load(root_directory)
    else:
        root = RootAuthority.create(root_directory, "CN=Fiberflow Demo Network Root,O=Demo")
    nodes = []
    for name in (ALICE, BOB):
        short = Party(name).organisation.lower()
        identity = load_or_create_identity(workdir / f"{node_key(name)}.key.pem", name)
        certificate = workdir / f"{short}.cert.pem"
        certificate.write_bytes(
            root.issue(certificate_request(identity)).public_bytes(Encoding.PEM)
        )
        extra = (
            'topology = "p2p"',
            f"network_root = {json.dumps(str(root_directory / ROOT_CERTIFICATE_FILE))}",
            f"certificate = {json.dumps(certificate.name)}",
        )
        inbound = f"sqlite:///{workdir / (short + '-inbound.db')}"
        nodes.append(_DemoNode(name, workdir, database_url, inbound, extra, launcher))
    return nodes[0], nodes[1]


def run_process_demo(
    flows: int,
    directory: Path | None,
    transport_url: str | None,
    database_url: str | None,
    timeout: float | None,
    topology: str = "shared",
) -> int:
    """Two node processes; N ping/pong flows; progress; summary. Returns the exit code."""
    owns_directory = directory is None
    workdir = Path(directory or tempfile.mkdtemp(prefix="fiberflow-demo-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    transport = transport_url or f"sqlite:///{workdir / 'queue.db'}"
    print(f"fiberflow demo: {flows} ping/pong flow(s), {ALICE} -> {BOB}, two node processes")
    try:
        run = run_pingpong_processes(
            flows, workdir, transport, database_url, timeout, True, True, topology
        )
    except DemoStartError as error:
        print(f"fiberflow demo: {error}", file=sys.stderr)
        return 2
    except DemoNodeDiedError as error:
        print(f"  FAILED: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # the demo's own start-up (its database, its broker)
        log.debug("fiberflow demo failed", exc_info=True)
        print(f"fiberflow demo: {startup_problem(error)}", file=sys.stderr)
        return 2
    for result in run.results[:3]:
        print(f"  result      PingFlow -> {result!r}")
    print(
        f"  summary     {flows} flows in {run.seconds:.2f} s ({flows / run.seconds:,.1f} "
        f"flows/s), {run.checkpoints_written} checkpoints written, {run.messages_sent} "
        f"messages sent; completed Alice {run.completed[0]}, Bob {run.completed[1]}; "
        f"nodes exited with {list(run.exit_codes)}"
    )
    print(f"  all flows returned {DEMO_REPLY!r}" if run.ok else "  SOME FLOWS OR NODES FAILED")
    if owns_directory and run.ok:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if run.ok else 1
