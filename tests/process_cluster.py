"""Node processes for crash tests: start, SIGKILL and restart real ``fiberflow node run``s.

:class:`Cluster` writes a config per node into a directory, runs each node as a child
process (logs in ``<node>.log``), and talks to the nodes through their databases
(:class:`~flows.node.client.NodeClient`). :func:`run_kill_campaign` is the SIGKILL driver used by
``tests/process/test_sigkill.py`` and ``python -m tests.kill_campaign``: it streams ping/pong,
three-party trade and payment flows into Alice while killing a seeded-random node with
SIGKILL at seeded-random moments and restarting it, then checks that every flow completed
exactly once on every node.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from sqlalchemy import select

from flows.flow_logic import FlowLogic
from flows.node.client import NodeClient, decode_outcome
from flows.party import Party
from flows.process.status import worker_status_path
from foundation.engine import drop_schema
from messaging.transports import purge_queues
from persistence import schema
from persistence.store import NodeDatabase
from samples.pingpong import PingFlow
from samples.trade import BuyerFlow, TradeOutcome
from statemachine.partitions import PARTITIONS
from tests.cordapp import LEDGER_METADATA, PaymentFlow, ledger_entries
from tests.waiting import serving, still_running, wait_until

RUN = uuid.uuid4().hex[:6]
"""Node names carry it: queues are named after nodes, so two test runs sharing a broker (or
a queue database) never consume each other's messages."""
NAMES = (
    f"O=Alice {RUN},L=London,C=GB",
    f"O=Bob {RUN},L=New York,C=US",
    f"O=Carol {RUN},L=Zurich,C=CH",
)
CORDAPPS = ["samples.pingpong", "samples.trade", "tests.cordapp"]


def wait_serving(
    status_path: Path, process: subprocess.Popen[bytes], what: str, timeout: float, log: Path
) -> None:
    """Wait until node process ``process`` writes ``status_path`` as serving; fail at once,
    with the end of ``log``, if it exits first."""
    wait_until(
        lambda: serving(status_path, process),
        f"{what} to start",
        timeout,
        check=still_running(process, log),
    )


def stop_process(process: subprocess.Popen[bytes] | None) -> int | None:
    """SIGTERM a node process (if running; SIGKILL after 60 s); returns its exit code."""
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


class ClusterNode:
    """One node process of a :class:`Cluster`."""

    def __init__(
        self,
        name: str,
        directory: Path,
        database_url: str | None,
        transport: str,
        extra_config: dict[str, Any] | None = None,
        extra_toml: str = "",
    ):
        """``extra_config`` adds or replaces top-level fields; ``extra_toml`` is appended
        (tables such as ``[bridge_credentials."*"]``)."""
        self.name = name
        self.short = Party(name).organisation.split()[0].lower()
        self.transport_url = transport
        self.schema: str | None = None
        if database_url is None:
            self.database_url = f"sqlite:///{directory / (self.short + '.db')}"
        else:
            self.database_url = database_url
            self.schema = f"ffkill_{self.short}_{uuid.uuid4().hex[:8]}"
        self.config_path = directory / f"{self.short}.toml"
        self.log_path = directory / f"{self.short}.log"
        self.status_path = directory / f"{self.short}.status.json"
        fields: dict[str, Any] = {
            "name": name,
            "database_url": self.database_url,
            "transport_url": transport,
            "cordapps": CORDAPPS,
            "synchronous": "NORMAL",
            "log_level": "INFO",
            "status_file": self.status_path.name,
        }
        if self.schema is not None:
            fields["database_schema"] = self.schema
        fields.update(extra_config or {})
        lines = [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
        self.config_path.write_text("\n".join(lines) + "\n" + extra_toml)
        self.process: subprocess.Popen[bytes] | None = None
        # The node database is made as the node process makes it (NodeDatabase creates it;
        # a client only opens one), before the process starts: the ledger's tables go in it.
        made = NodeDatabase(self.database_url, schema_name=self.schema)
        try:
            LEDGER_METADATA.create_all(made.engine)
        finally:
            made.close()
        self.client = NodeClient(self.database_url, database_schema=self.schema)
        self.starts = 0

    def start(self) -> None:
        """Start the node process (its log is appended to)."""
        self.process = self.spawn(self.log_path)
        self.starts += 1

    def spawn(self, log_path: Path, worker: str | None = None) -> subprocess.Popen[bytes]:
        """Start a process of this node's config logging to ``log_path`` (not tracked).

        With ``worker``, as that worker of the node run by several workers.
        """
        command = [sys.executable, "-m", "flows.cli", "node", "run"]
        command += ["--config", str(self.config_path)]
        if worker is not None:
            command += ["--worker", worker]
        with log_path.open("ab") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def worker_status_path(self, worker: str) -> Path:
        """The status file worker ``worker`` of this node writes."""
        return worker_status_path(self.status_path, worker)

    def wait_started(self, timeout: float = 60.0) -> None:
        """Wait until this incarnation serves (its status file says so, with its pid)."""
        assert self.process is not None
        wait_serving(self.status_path, self.process, self.name, timeout, self.log_path)

    def check_alive(self) -> None:
        """Raise with the end of the log if the process exited on its own."""
        assert self.process is not None
        if self.process.poll() is not None:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
            raise AssertionError(f"{self.name} exited ({self.process.returncode}):\n{tail}")

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> int | None:
        """SIGTERM the process (if running); returns its exit code."""
        return stop_process(self.process)

    def counts(self, table: Any) -> Counter[str]:
        """Flow classes (short names) of the rows of ``table`` (results or exceptions)."""
        with self.client.database.engine.connect() as connection:
            names = connection.execute(select(table.c.flow_class)).scalars().all()
        return Counter(name.rsplit(".", 1)[-1] for name in names)


class Cluster:
    """Alice, Bob and Carol as node processes on one transport (see the module docstring).

    With ``p2p`` the nodes form a peer-to-peer network instead: each one's inbound is a SQL
    queue file of its own in ``directory`` (``transport`` is not used) and bridges carry the
    messages.
    """

    def __init__(
        self,
        directory: Path,
        transport: str,
        database_url: str | None,
        extra_config: dict[str, Any] | None = None,
        p2p: bool = False,
    ) -> None:
        self.directory = directory
        self.transport = transport
        self.database_url = database_url
        self.nodes = []
        for name in NAMES:
            config = dict(extra_config or {})
            inbound = transport
            if p2p:
                short = Party(name).organisation.split()[0].lower()
                inbound = f"sqlite:///{directory / (short + '-inbound.db')}"
                config["topology"] = "p2p"
            self.nodes.append(ClusterNode(name, directory, database_url, inbound, config))

    def start(self) -> None:
        """Start every node and wait until each has started."""
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_started()

    def close(self) -> None:
        """Stop every node, release connections, drop PostgreSQL schemas and the queues."""
        for node in self.nodes:
            node.stop()
            node.client.close()
        if self.database_url is not None:
            for node in self.nodes:
                assert node.schema is not None
                drop_schema(self.database_url, node.schema)
        for node in self.nodes:
            purge_queues(node.transport_url, [node.name])


def check_payments_once(
    cluster: Cluster, payments: list[PaymentFlow], ids: list[str], wait: float | None = None
) -> None:
    """Each payment's two ledger effects on Alice and its credit on Carol happened once.

    With ``wait``, first wait (that many seconds at most) for every payment's outcome and
    check each is its receipt.
    """
    if wait is not None:
        outcomes = cluster.nodes[0].client.wait(ids, timeout=wait)
        assert [decode_outcome(outcomes[i]) for i in ids] == [
            f"receipt {p.amount}" for p in payments
        ]
    alice, _, carol = cluster.nodes
    entries = ledger_entries(alice.client.database.engine)
    for payment, flow_id in zip(payments, ids, strict=True):
        mine = [entry for owner, entry in entries if owner == flow_id]
        assert mine == [f"debit {payment.amount}", f"receipt {payment.amount}"], mine
    wait_until(
        lambda: len(ledger_entries(carol.client.database.engine)) >= len(payments),
        "Carol's credits",
    )
    credits = Counter(entry for _, entry in ledger_entries(carol.client.database.engine))
    assert credits == Counter(f"credit {p.amount}" for p in payments)


@attrs.define
class Worker:
    """One worker process of a node."""

    node: ClusterNode
    name: str
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.node.short}-{self.name}.log"

    @property
    def status_path(self) -> Path:
        return self.node.worker_status_path(self.name)

    def start(self) -> None:
        self.process = self.node.spawn(self.log_path, worker=self.name)

    def wait_serving(self, timeout: float = 90) -> None:
        """Wait until this incarnation serves (its status file says so, with its pid)."""
        assert self.process is not None
        wait_serving(self.status_path, self.process, f"worker {self.name}", timeout, self.log_path)

    def partitions(self) -> list[int] | None:
        """The partitions this incarnation's status file lists (None: not written yet)."""
        try:
            status: dict[str, Any] = json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return None
        if self.process is None or status.get("pid") != self.process.pid:
            return None
        found = status.get("partitions")
        return None if found is None else list(found)

    def log(self) -> str:
        """Everything the worker's processes logged."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM the process (if running); returns its exit code."""
        return stop_process(self.process)


def settled(workers: list[Worker]) -> bool:
    """True once the running workers' status files show a fair split of every partition."""
    shares = [w.partitions() for w in workers]
    if any(share is None for share in shares):
        return False
    held = [p for share in shares for p in share or []]
    sizes = [len(share or []) for share in shares]
    return sorted(held) == list(range(PARTITIONS)) and max(sizes) - min(sizes) <= 1


@attrs.frozen
class KillReport:
    """What a kill campaign did."""

    flows: int
    kills: int
    kills_by_node: dict[str, int]
    seconds: float


def _flows(count: int, rng: random.Random) -> list[tuple[str, FlowLogic[Any]]]:
    _, bob, carol = (Party(name) for name in NAMES)
    flows: list[tuple[str, FlowLogic[Any]]] = []
    for index in range(count):
        kind = ("ping", "trade", "payment")[index % 3]
        if kind == "ping":
            flows.append((kind, PingFlow(bob)))
        elif kind == "trade":
            flows.append((kind, BuyerFlow(bob, carol, "widget", 2, rng.randint(1, 5000))))
        else:
            flows.append((kind, PaymentFlow(carol, rng.randint(1, 1000))))
    return flows


def run_kill_campaign(
    directory: Path,
    transport: str,
    database_url: str | None,
    flows: int,
    kills: int,
    seed: int,
    say: Callable[[str], None] = lambda _: None,
    p2p: bool = False,
) -> KillReport:
    """Stream ``flows`` flows into Alice while killing nodes ``kills`` times; check all.

    ``p2p``: the nodes form a peer-to-peer network (see :class:`Cluster`).
    """
    rng = random.Random(seed)
    cluster = Cluster(directory, transport, database_url, p2p=p2p)
    try:
        cluster.start()
        alice = cluster.nodes[0]
        planned = _flows(flows, rng)
        ids: list[str] = []
        kills_by_node: Counter[str] = Counter()
        began = time.perf_counter()
        batch = max(1, flows // max(kills, 1))
        submitted = 0
        while submitted < flows or sum(kills_by_node.values()) < kills:
            if submitted < flows:
                chunk = planned[submitted : submitted + batch]
                ids += alice.client.start_flows([flow for _, flow in chunk])
                submitted += len(chunk)
            time.sleep(rng.uniform(0.02, 0.3))
            if sum(kills_by_node.values()) < kills:
                victim = rng.choice(cluster.nodes)
                victim.kill()
                kills_by_node[victim.short] += 1
                time.sleep(rng.uniform(0.0, 0.2))  # the others keep working meanwhile
                victim.start()
                victim.wait_started()
                done = sum(kills_by_node.values())
                say(f"kill {done}/{kills}: {victim.name} (SIGKILL, restarted)")
            for node in cluster.nodes:
                node.check_alive()
        outcomes = alice.client.wait(ids, timeout=300)
        seconds = time.perf_counter() - began
        _check(cluster, planned, ids, outcomes)
        return KillReport(flows, sum(kills_by_node.values()), dict(kills_by_node), seconds)
    finally:
        cluster.close()


@attrs.frozen
class WorkerCampaignReport:
    """What a campaign against the workers of a node did."""

    flows: int
    kills: int
    stops: int
    fenced: int
    """Workers frozen past their lease whose partitions were taken over: on thawing they
    committed nothing and exited with status 3."""
    seconds: float


def run_worker_campaign(
    directory: Path,
    transport: str,
    database_url: str,
    flows: int,
    disruptions: int,
    seed: int,
    workers: int = 3,
    say: Callable[[str], None] = lambda _: None,
    lease_seconds: float = 2.0,
) -> WorkerCampaignReport:
    """Stream flows into Alice, run by ``workers`` worker processes, while disrupting them.

    Each disruption picks a seeded-random worker and either SIGKILLs it (restarted after a
    moment) or SIGSTOPs it for a seeded-random while, up to two and a half leases (then
    SIGCONT): one frozen past its lease has its partitions taken over and, once thawed, must
    commit nothing and exit with status 3 (it is then restarted). Bob and Carol run as one
    process each. At the end every flow must have completed exactly once on every node, with
    every ledger effect once (counted from the databases).
    """
    rng = random.Random(seed)
    cluster = Cluster(directory, transport, database_url, {"lease_seconds": lease_seconds})
    alice = cluster.nodes[0]
    crew = [Worker(alice, f"w{i + 1}", directory) for i in range(workers)]
    kills = stops = fenced = 0

    def restart_the_fenced() -> int:
        found = 0
        for worker in crew:
            assert worker.process is not None
            code = worker.process.poll()
            if code is None:
                continue
            assert code == 3, f"worker {worker.name} exited with {code}:\n{worker.log()[-3000:]}"
            assert "lost the node lease" in worker.log()
            found += 1
            worker.start()
            say(f"  worker {worker.name} was fenced out after a takeover (exit 3); restarted")
        return found

    try:
        for node in cluster.nodes[1:]:
            node.start()
        for node in cluster.nodes[1:]:
            node.wait_started()
        for worker in crew:
            worker.start()
        for worker in crew:
            worker.wait_serving()
        planned = _flows(flows, rng)
        ids: list[str] = []
        began = time.perf_counter()
        batch = max(1, flows // max(disruptions, 1))
        submitted = 0
        while submitted < flows or kills + stops < disruptions:
            if submitted < flows:
                chunk = planned[submitted : submitted + batch]
                ids += alice.client.start_flows([flow for _, flow in chunk])
                submitted += len(chunk)
            time.sleep(rng.uniform(0.02, 0.3))
            fenced += restart_the_fenced()
            if kills + stops < disruptions:
                victim = rng.choice(crew)
                assert victim.process is not None
                if rng.random() < 0.75:
                    victim.process.send_signal(signal.SIGKILL)
                    victim.process.wait(30)
                    time.sleep(rng.uniform(0.0, 0.3))  # the others keep working meanwhile
                    victim.start()
                    kills += 1
                    what = "SIGKILL, restarted"
                else:
                    frozen = rng.uniform(0.2, 2.5 * lease_seconds)
                    victim.process.send_signal(signal.SIGSTOP)
                    time.sleep(frozen)
                    victim.process.send_signal(signal.SIGCONT)
                    stops += 1
                    what = f"SIGSTOP for {frozen:.1f} s, then SIGCONT"
                say(f"disruption {kills + stops}/{disruptions}: worker {victim.name} ({what})")
            for node in cluster.nodes[1:]:
                node.check_alive()
        deadline = time.monotonic() + 300
        while len(alice.client.outcomes(ids)) < len(ids) and time.monotonic() < deadline:
            fenced += restart_the_fenced()
            time.sleep(0.2)
        outcomes = alice.client.wait(ids, timeout=max(1.0, deadline - time.monotonic()))
        seconds = time.perf_counter() - began
        _check(cluster, planned, ids, outcomes)
        fenced += restart_the_fenced()
        return WorkerCampaignReport(flows, kills, stops, fenced, seconds)
    finally:
        for worker in crew:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
            worker.stop()
        cluster.close()


def _check(
    cluster: Cluster,
    planned: list[tuple[str, FlowLogic[Any]]],
    ids: list[str],
    outcomes: dict[str, Any],
) -> None:
    alice, bob, carol = cluster.nodes
    kinds = Counter(kind for kind, _ in planned)
    for (kind, flow), flow_id in zip(planned, ids, strict=True):
        result = decode_outcome(outcomes[flow_id])
        if kind == "ping":
            assert result == "Pong"
        elif kind == "trade":
            assert isinstance(result, TradeOutcome) and result.decision.approved
            assert result.proposal.unit_price_cents == flow.unit_price_cents  # type: ignore[attr-defined]
        else:
            assert result == f"receipt {flow.amount}"  # type: ignore[attr-defined]
    # Exactly once on every node: one responder per initiated session, no flow twice.
    expected = {
        alice.short: Counter(
            {
                "PingFlow": kinds["ping"],
                "BuyerFlow": kinds["trade"],
                "PaymentFlow": kinds["payment"],
            }
        ),
        bob.short: Counter({"PongFlow": kinds["ping"], "SellerFlow": kinds["trade"]}),
        carol.short: Counter({"ApproverFlow": kinds["trade"], "PayeeFlow": kinds["payment"]}),
    }

    def found() -> dict[str, Counter[str]]:
        return {node.short: node.counts(schema.node_flow_results) for node in cluster.nodes}

    wait_until(  # responders finish a moment after the initiators' outcomes are in
        lambda: found() == expected,
        f"results per node {expected}",
        120,
        explain=lambda: str(found()),
    )
    for node in cluster.nodes:
        assert node.counts(schema.node_flow_exceptions) == Counter(), node.name
    payments = [(flow, fid) for (k, flow), fid in zip(planned, ids, strict=True) if k == "payment"]
    alice_rows = ledger_entries(alice.client.database.engine)
    carol_rows = Counter(entry for _, entry in ledger_entries(carol.client.database.engine))
    for flow, flow_id in payments:
        amount = flow.amount  # type: ignore[attr-defined]
        mine = [entry for fid, entry in alice_rows if fid == flow_id]
        assert mine == [f"debit {amount}", f"receipt {amount}"], (flow_id, mine)
    assert carol_rows == Counter(f"credit {f.amount}" for f, _ in payments)  # type: ignore[attr-defined]
    wait_until(  # relays empty their outboxes shortly after
        lambda: all(node.client.database.count("node_outbox") == 0 for node in cluster.nodes),
        "every outbox to be empty",
        120,
    )
    for node in cluster.nodes:
        assert node.client.database.count("node_outbox") == 0, f"{node.name} outbox not empty"
        assert node.client.database.count("node_checkpoints") == 0, f"{node.name} checkpoints"
