"""``fiberflow demo``: ping/pong between Alice and Bob.

By default the two nodes are separate processes (``fiberflow node run``) on the embedded
durable default: a SQLite database each and the SQL queue in a shared SQLite file. The demo
writes their configs into a directory, starts them, asks Alice (through her database) to
start N ``PingFlow``s to Bob, shows progress until every flow has finished, stops both nodes
with SIGTERM and prints a summary. ``--transport`` and ``--database`` run the same demo on
RabbitMQ and PostgreSQL; ``--in-process`` runs both nodes in this process on the in-memory
test network and prints every checkpoint written.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from flows.client import NodeClient, decode_outcome
from flows.party import Party
from flows.progress import ProgressBar
from flows.testing import MockNetwork
from persistence.store import drop_schema
from samples.pingpong import PingFlow
from statemachine.state import Checkpoint

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"
STOP_TIMEOUT_SECONDS = 30.0


class DemoNodeDiedError(RuntimeError):
    """A node process of the demo exited before the flows finished."""


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
    with MockNetwork(
        cordapps=["samples.pingpong"], directory=directory, synchronous="FULL"
    ) as network:
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

            mock.node.database.checkpoint_listeners.append(listener)
        started = time.perf_counter()
        handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(flows)]
        rounds = network.run_network()
        elapsed = time.perf_counter() - started
        results = [h.result() for h in handles]
        for handle, result in list(zip(handles, results, strict=True))[:3]:
            print(f"  result      PingFlow {handle.flow_id[:8]} -> {result!r}")
        if len(results) > 3:
            print(f"  ... {len(results) - 3} more results")
        ok = results == ["Pong"] * flows
        written = sum(m.node.database.checkpoints_written for m in (alice, bob))
        sent = network.messaging.statistics.sent
        left = len(alice.checkpoints()) + len(bob.checkpoints())
        print(
            f"  summary     {flows} flows in {elapsed:.3f} s ({flows / elapsed:,.0f} flows/s), "
            f"{rounds} rounds, {written} checkpoints written, {sent} messages sent, "
            f"{left} checkpoints left"
        )
        print("  all flows returned 'Pong'" if ok else "  SOME FLOWS FAILED")
        return 0 if ok and left == 0 else 1


class _DemoNode:
    def __init__(self, name: str, directory: Path, database_url: str | None, transport: str):
        self.name = name
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
            'cordapps = ["samples.pingpong"]',
            'network_map = "network-map"',
            f"status_file = {json.dumps(self.status_path.name)}",
        ]
        if self.schema is not None:
            lines.append(f"database_schema = {json.dumps(self.schema)}")
        self.config_path.write_text("\n".join(lines) + "\n")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flows.cli",
                    "node",
                    "run",
                    "--config",
                    str(self.config_path),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

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


def run_process_demo(
    flows: int,
    directory: Path | None,
    transport_url: str | None,
    database_url: str | None,
    timeout: float | None,
) -> int:
    """Two node processes; N ping/pong flows; progress; summary. Returns the exit code."""
    owns_directory = directory is None
    workdir = Path(directory or tempfile.mkdtemp(prefix="fiberflow-demo-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    transport = transport_url or f"sqlite:///{workdir / 'queue.db'}"
    alice = _DemoNode(ALICE, workdir, database_url, transport)
    bob = _DemoNode(BOB, workdir, database_url, transport)
    print(f"fiberflow demo: {flows} ping/pong flow(s), {ALICE} -> {BOB}, two node processes")
    print(f"  directory:  {workdir} (configs, logs, status files)")
    print(
        f"  databases:  {alice.database_url if database_url is None else database_url}"
        + ("" if database_url is None else f" (schemas {alice.schema}, {bob.schema})")
    )
    print(f"  transport:  {transport}")
    client: NodeClient | None = None
    ok = False
    try:
        for node in (alice, bob):
            node.start()
        client = NodeClient(alice.database_url, database_schema=alice.schema)
        started = time.perf_counter()
        flow_ids = client.start_flows([PingFlow(Party(BOB)) for _ in range(flows)])
        bar = ProgressBar(flows, "flows")

        def progress(done: int, total: int) -> None:
            bar.update(done)
            for node in (alice, bob):
                node.check_alive()

        outcomes = client.wait(flow_ids, timeout or max(120.0, flows * 0.2), progress)
        bar.finish()
        elapsed = time.perf_counter() - started
        results = [decode_outcome(outcomes[f]) for f in flow_ids]
        ok = results == ["Pong"] * flows
        for flow_id, result in list(zip(flow_ids, results, strict=True))[:3]:
            print(f"  result      PingFlow {flow_id[:8]} -> {result!r}")
        codes = [node.stop() for node in (alice, bob)]
        statuses = [node.status() for node in (alice, bob)]
        written = sum(s.get("checkpoints_written", 0) for s in statuses)
        sent = sum(s.get("messages_sent", 0) for s in statuses)
        completed = [s.get("flows_completed", 0) for s in statuses]
        print(
            f"  summary     {flows} flows in {elapsed:.2f} s ({flows / elapsed:,.1f} flows/s), "
            f"{written} checkpoints written, {sent} messages sent; completed "
            f"Alice {completed[0]}, Bob {completed[1]}; nodes exited with {codes}"
        )
        ok = ok and codes == [0, 0]
        print("  all flows returned 'Pong'" if ok else "  SOME FLOWS OR NODES FAILED")
    except DemoNodeDiedError as error:
        print(f"  FAILED: {error}", file=sys.stderr)
    finally:
        for node in (alice, bob):
            node.stop()
        if client is not None:
            client.close()
        if database_url is not None:
            for node in (alice, bob):
                assert node.schema is not None
                drop_schema(database_url, node.schema)
        if owns_directory and ok:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1
