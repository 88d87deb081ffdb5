"""Node databases for the analytics tests: real flows on MockNetwork nodes, then corruption.

:func:`build_clean_network` runs a mix of flows on four MockNetwork nodes (completed ping/pong,
echo and trade conversations, failed flows, a flow kept in the hospital, and conversations
left open on purpose: an initiator that sleeps for a day between two messages while its
responder waits). The node databases are then copied, so the copies are what a snapshot of
a quiet network looks like. :func:`corrupt` damages a copy in the ways an exactly-once bug or
an operator accident would, and returns exactly what it injected, so that each check can be
held to flag that and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from flows import (
    FOREVER,
    FlowLogic,
    FlowSession,
    Party,
    UnexpectedFlowEndException,
    initiated_by,
    initiating_flow,
)
from flows.testing import MockNetwork, MockNode
from samples.pingpong import PingFlow
from samples.trade import BuyerFlow
from statemachine import session_ids
from tests.cordapp import EchoFlow, FailingInitiator, UnansweredFlow

DAY = 86_400.0

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=Paris,C=FR"
CHARLIE = "O=Charlie,L=Rome,C=IT"
DAVE = "O=Dave,L=Oslo,C=NO"
NAMES = (ALICE, BOB, CHARLIE, DAVE)


@initiating_flow
class LingeringFlow(FlowLogic[str]):
    """Says hello, sleeps for a day (durably), says goodbye and returns the answer."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        session = self.initiate_flow(self.peer)
        session.send("hello")
        self.sleep(DAY)
        return session.send_and_receive(str, "goodbye").unwrap(lambda m: m)


@initiated_by(LingeringFlow)
class LingeringResponder(FlowLogic[str]):
    """Waits for the hello and then for the goodbye (a day later), and answers."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> str:
        hello = self.session.receive(str, timeout=FOREVER).unwrap(lambda m: m)
        goodbye = self.session.receive(str, timeout=FOREVER).unwrap(lambda m: m)
        self.session.send("see you")
        return f"{hello} {goodbye}"


@initiating_flow
class RefusalCaughtFlow(FlowLogic[str]):
    """Asks a peer that has no responder for it, catches the refusal and sleeps a day.

    ``docs/writing-flows.md`` allows it: a flow may catch ``UnexpectedFlowEndException`` and
    go on without the session. Both nodes' tables then agree: the peer consumed the opening
    message and holds no flow for it, and the live flow no longer waits on the session.
    """

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        session = self.initiate_flow(self.peer)
        with contextlib.suppress(UnexpectedFlowEndException):
            session.send_and_receive(str, "anyone there?").unwrap(lambda m: m)
        self.sleep(DAY)
        return "asked nobody else"


CORDAPPS = ["samples.pingpong", "samples.trade", "tests.cordapp", "tests.analytics_data"]


@attrs.frozen
class Lingering:
    """An open conversation: ``initiator`` (on ``initiator_node``) sleeps, the responder waits."""

    initiator_node: str
    initiator: str
    responder_node: str
    responder: str
    session: str
    """The initiator's session id (its first session), as the databases show it."""


@attrs.frozen
class NetworkData:
    """Copies of the node databases of a quiet network, and what ran on it."""

    directory: Path
    databases: dict[str, Path]
    """Node name to its SQLite file (a copy taken after the network went quiet)."""
    now_ms: int
    """The mock clock when the copies were taken (milliseconds)."""
    finished: dict[str, dict[str, str]]
    """Node name to {flow id: "COMPLETED" or "FAILED"} of the flows that finished there."""
    live: dict[str, dict[str, str]]
    """Node name to {flow id: status} of the flows with a checkpoint."""
    lingering: list[Lingering]
    echo_session: str
    """The session of a finished EchoFlow from Alice to Bob (several messages each way)."""
    hospitalized: str
    """The flow (on Charlie) an operator kept in the hospital."""
    paused: tuple[str, str]
    """(node, flow) an operator paused: Bob's responder waiting on Dave."""
    keys: dict[str, Path] = attrs.field(factory=dict)
    """Node name to its key file (the Ed25519 PEM a node config names as ``key_file``): the
    checkpoint MAC key of its blobs is derived from it."""

    def sources(self, names: tuple[str, ...] = NAMES) -> list[str]:
        """``NAME=URL`` arguments for the given nodes."""
        return [f"{name}=sqlite:///{self.databases[name]}" for name in names]

    def copy_to(self, directory: Path) -> NetworkData:
        """A copy of every database in ``directory`` (to corrupt it without touching this)."""
        directory.mkdir(parents=True, exist_ok=True)
        copies = {}
        for name, path in self.databases.items():
            copies[name] = directory / path.name
            shutil.copyfile(path, copies[name])
        return attrs.evolve(self, directory=directory, databases=copies)


def _flow_rows(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(finished flows, live flows with their status, session waited on -> live flow)."""
    connection = sqlite3.connect(path)
    try:
        finished = {
            row[0]: "COMPLETED"
            for row in connection.execute("SELECT flow_id FROM node_flow_results")
        }
        for (flow_id,) in connection.execute("SELECT flow_id FROM node_flow_exceptions"):
            finished[flow_id] = "FAILED"
        live, waiting = {}, {}
        query = "SELECT flow_id, status, suspended_on, waiting_for FROM node_checkpoints"
        for flow_id, status, suspended_on, waiting_for in connection.execute(query):
            live[flow_id] = status
            if suspended_on == "Receive":
                for wait in json.loads(waiting_for):
                    waiting[wait["session"]] = flow_id
    finally:
        connection.close()
    return finished, live, waiting


def first_session_of(flow_id: str, session_id: str) -> bool:
    """True if ``session_id`` is the first session flow ``flow_id`` opened.

    Session ids are ``F.s0``, or ``<tag>-F.s0`` with the initiating node's identity tag: the
    test data is found in the databases, not rebuilt, so it holds for either form.
    """
    return re.fullmatch(rf"(?:[0-9a-f]{{16}}-)?{re.escape(flow_id)}\.s0", session_id) is not None


def _responder_of(path: Path, flow_id: str) -> str:
    """The flow in ``path``'s database that waits on the first session of ``flow_id``."""
    _, _, waiting = _flow_rows(path)
    (responder,) = [
        flow for session, flow in waiting.items() if first_session_of(flow_id, session[:-2])
    ]
    return responder


def _consumed_sessions(path: Path, flow_id: str) -> set[str]:
    """The initiator sessions of ``flow_id`` in which ``path``'s node consumed a message."""
    connection = sqlite3.connect(path)
    try:
        sessions = {row[0] for row in connection.execute("SELECT session_id FROM node_message_ids")}
    finally:
        connection.close()
    return {session for session in sessions if first_session_of(flow_id, session)}


def copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a live SQLite node database (SQLite's backup API, as analyze)."""
    live, copy = sqlite3.connect(source), sqlite3.connect(target)
    try:
        live.backup(copy)
    finally:
        copy.close()
        live.close()


def build_clean_network(directory: Path) -> NetworkData:
    """Run the flows on Alice, Bob, Charlie and Dave and copy their databases."""
    network = MockNetwork(cordapps=CORDAPPS, directory=directory / "run")
    try:
        alice, bob, charlie, dave = (network.create_node(name) for name in NAMES)
        keys = {mock.name: write_key_file(mock, directory / "keys") for mock in network.nodes}
        handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(5)]
        handles += [bob.start_flow(PingFlow(charlie.party)) for _ in range(3)]
        echo = alice.start_flow(EchoFlow(bob.party, ["one", "two", "three", "four"]))
        handles.append(echo)
        handles.append(alice.start_flow(BuyerFlow(bob.party, charlie.party, "tea", 10, 250)))
        handles.append(alice.start_flow(BuyerFlow(bob.party, charlie.party, "gold", 1, 10**8)))
        handles.append(alice.start_flow(FailingInitiator(charlie.party, "flow_exception")))
        handles.append(alice.start_flow(UnansweredFlow(bob.party)))
        pairs = [(alice, bob), (alice, bob), (charlie, alice), (dave, alice), (charlie, bob)]
        pairs.append((dave, bob))
        started = [(a.name, b.name, a.start_flow(LingeringFlow(b.party)).flow_id) for a, b in pairs]
        network.run_network(advance_clock=False)
        assert all(handle.done for handle in handles)
        kept = started[4][2]
        charlie.node.keep_in_hospital(kept, "kept for observation by the test")
        bob_database = Path(bob.config.database_url.removeprefix("sqlite:///"))
        paused = _responder_of(bob_database, started[5][2])
        bob.node.pause_flow(paused)  # an operator paused Bob's side of Dave's conversation
        network.run_network(advance_clock=False)
        now_ms = round(network.clock.now() * 1000)
        copies = directory / "clean"
        copies.mkdir(parents=True, exist_ok=True)
        databases = {}
        for mock in network.nodes:
            source = Path(mock.config.database_url.removeprefix("sqlite:///"))
            databases[mock.name] = copies / source.name
            copy_database(source, databases[mock.name])
    finally:
        network.stop_nodes()
    finished, live, waiting = {}, {}, {}
    for name, path in databases.items():
        finished[name], live[name], waiting[name] = _flow_rows(path)
    lingering = []
    for initiator_node, responder_node, flow_id in started:
        (session,) = [
            waited[: -len(".r")]
            for waited in waiting[responder_node]
            if first_session_of(flow_id, waited[: -len(".r")])
        ]
        responder = waiting[responder_node][f"{session}.r"]
        lingering.append(Lingering(initiator_node, flow_id, responder_node, responder, session))
    (echo_session,) = _consumed_sessions(databases[ALICE], echo.flow_id)
    return NetworkData(
        directory=copies,
        databases=databases,
        now_ms=now_ms,
        finished=finished,
        live=live,
        lingering=lingering,
        echo_session=echo_session,
        hospitalized=kept,
        paused=(BOB, paused),
        keys=keys,
    )


def two_node_network(
    directory: Path, flow: Callable[[Party], Any], pause_s: float = 2, lives_on: bool = True
) -> tuple[NetworkData, str]:
    """Alice runs ``flow`` against Bob, the clock advanced ``pause_s`` between two runs of
    the network: the copied databases and the nodes' keys, and Alice's flow id (still live
    unless ``lives_on`` is False)."""
    cordapps = [*CORDAPPS, "tests.analytics_blob_flows"]
    with MockNetwork(cordapps=cordapps, directory=directory / "run") as network:
        alice, bob = network.create_node(ALICE), network.create_node(BOB)
        keys = {m.name: write_key_file(m, directory / "keys") for m in network.nodes}
        handle = alice.start_flow(flow(bob.party))
        network.run_network(advance_clock=False)
        network.clock.advance(pause_s)
        network.run_network(advance_clock=False)
        assert handle.done() is not lives_on
        now_ms = round(network.clock.now() * 1000)
        databases = {}
        for mock in network.nodes:
            source = Path(mock.config.database_url.removeprefix("sqlite:///"))
            databases[mock.name] = directory / source.name
            copy_database(source, databases[mock.name])
    data = NetworkData(
        directory=directory,
        databases=databases,
        now_ms=now_ms,
        finished={},
        live={},
        lingering=[],
        echo_session="",
        hospitalized="",
        paused=(BOB, ""),
        keys=keys,
    )
    return data, handle.flow_id


def write_key_file(mock: MockNode, directory: Path) -> Path:
    """Write ``mock``'s private key as its node would keep it (PKCS#8 PEM, mode 0600)."""
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{mock.party.organisation.lower()}.key.pem"
    pem = mock.identity.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(pem)
    path.chmod(0o600)
    return path


@attrs.frozen
class Injected:
    """What :func:`corrupt` did, as the checks should report it."""

    orphan: tuple[str, str, str, str]
    """(node, session, counterparty, missing flow): a session whose other end was deleted."""
    consumed_twice: list[tuple[str, str, int, list[str]]]
    """(node, session, sequence, ids) recorded twice."""
    id_mismatch: tuple[str, str]
    """(node, message id) of the copy recorded under a fresh id."""
    gap: tuple[str, str, int]
    """(node, session, sequence) whose dedup id was lost."""
    undelivered: tuple[str, str, str]
    """(node, message id, target) left in the outbox."""
    stuck: tuple[str, str, str, str]
    """(node, flow, session, counterparty): waiting for three hours on a dead node."""
    nodes: tuple[str, ...]
    """The nodes to analyze (Dave, the dead node, is not among them)."""


def _one(connection: sqlite3.Connection, query: str, *parameters: object) -> tuple[object, ...]:
    row = connection.execute(query, parameters).fetchone()
    assert row is not None, query
    return tuple(row)


def corrupt(data: NetworkData, directory: Path) -> tuple[NetworkData, Injected]:
    """Copy ``data`` to ``directory`` and damage the copy (see :class:`Injected`)."""
    broken = data.copy_to(directory)
    db = broken.databases
    first, second, _, from_dave, _, paused_from_dave = broken.lingering
    # 1. An operator deleted a live flow: the initiator Alice's responder on Bob waits for.
    with sqlite3.connect(db[ALICE]) as alice:
        for table in ("node_checkpoints", "node_checkpoint_blobs"):
            alice.execute(f"DELETE FROM {table} WHERE flow_id = ?", (first.initiator,))
    alice.close()
    orphan = (BOB, f"{first.session}.r", ALICE, first.initiator)
    # 2. The same message consumed twice on Bob: recorded again under a fresh random id, as a
    #    sender that re-sent it with a new id (not N-<session>-<sequence>) would cause.
    bob = sqlite3.connect(db[BOB])
    with bob:
        message_id, sender, session, sequence, at = _one(
            bob,
            "SELECT message_id, sender, session_id, sequence, inserted_at FROM node_message_ids "
            "WHERE sender = ? AND session_id NOT LIKE ? AND session_id NOT IN (?, ?) "
            "ORDER BY message_id LIMIT 1",
            ALICE,
            f"{broken.echo_session}%",
            f"{first.session}.r",
            f"{second.session}.r",
        )
        fresh = uuid.UUID(int=0x5EED).hex
        bob.execute(
            "INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)",
            (fresh, sender, session, sequence, at),
        )
        # 3. A dedup id lost: message 2 of the echo session, with 3, 4 and 5 recorded.
        gap_session = f"{broken.echo_session}.r"
        bob.execute(
            "DELETE FROM node_message_ids WHERE session_id = ? AND sequence = 2", (gap_session,)
        )
    bob.close()
    twice = [(BOB, str(session), int(str(sequence)), sorted([str(message_id), fresh]))]
    # 4. Charlie's dedup table rebuilt without its primary key (a botched restore), and one
    #    message recorded twice under the same id.
    charlie = sqlite3.connect(db[CHARLIE])
    with charlie:
        charlie.execute("CREATE TABLE dedup_copy AS SELECT * FROM node_message_ids")
        charlie.execute("DROP TABLE node_message_ids")
        charlie.execute("ALTER TABLE dedup_copy RENAME TO node_message_ids")
        copied = _one(charlie, "SELECT * FROM node_message_ids ORDER BY message_id LIMIT 1")
        charlie.execute("INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)", copied)
    charlie.close()
    twice.append((CHARLIE, str(copied[2]), int(str(copied[3])), [str(copied[0])] * 2))
    # 5. Alice's goodbye on her second lingering session committed to the outbox ten minutes
    #    ago and never sent.
    undelivered = f"N-{second.session}-1"
    with sqlite3.connect(db[ALICE]) as alice:
        alice.execute(
            "INSERT INTO node_outbox VALUES (?, ?, ?, ?)",
            (undelivered, BOB, b"goodbye", broken.now_ms - 10 * 60_000),
        )
    alice.close()
    # 6. Dave died three hours ago (its database is gone): Alice's responder still waits.
    #    Bob's responder waiting on Dave has been paused by an operator just as long: it is
    #    on hold, not stuck, and must not be reported as stuck.
    three_hours_ago = broken.now_ms - 3 * 3_600_000
    for node, flow_id in ((ALICE, from_dave.responder), (BOB, paused_from_dave.responder)):
        with sqlite3.connect(db[node]) as connection:
            connection.execute(
                "UPDATE node_checkpoints SET updated_at = ?, created_at = ? WHERE flow_id = ?",
                (three_hours_ago, three_hours_ago, flow_id),
            )
            connection.execute(
                "UPDATE node_paused_flows SET paused_at = ? WHERE flow_id = ?",
                (three_hours_ago, flow_id),
            )
        connection.close()
    assert broken.paused == (BOB, paused_from_dave.responder)
    injected = Injected(
        orphan=orphan,
        consumed_twice=sorted(twice),
        id_mismatch=(BOB, fresh),
        gap=(BOB, gap_session, 2),
        undelivered=(ALICE, undelivered, BOB),
        stuck=(ALICE, from_dave.responder, f"{from_dave.session}.r", DAVE),
        nodes=(ALICE, BOB, CHARLIE),
    )
    return broken, injected


# --- one inconsistency at a time, on SQLite files or PostgreSQL schemas alike -----------------

Execute = Callable[[str, str, dict[str, object]], list[tuple[Any, ...]]]
"""Run one statement on a node's database: ``(node, sql, parameters) -> rows``. The SQL
names tables as ``{t}node_...`` (``{t}`` is the schema prefix on PostgreSQL) and takes
``:name`` parameters."""


@attrs.frozen
class Expected:
    """A finding one injection must give, and nothing else in the checks it is for."""

    check: str
    node: str
    flow_id: str
    kind: str


def sqlite_execute(data: NetworkData) -> Execute:
    """:data:`Execute` on the SQLite files of ``data``."""
    return sqlite_files_execute(data.databases)


def sqlite_files_execute(databases: dict[str, Path]) -> Execute:
    """:data:`Execute` on SQLite files, by node name."""

    def execute(node: str, sql: str, parameters: dict[str, object]) -> list[tuple[Any, ...]]:
        connection = sqlite3.connect(databases[node])
        try:
            with connection:
                return [tuple(r) for r in connection.execute(sql.format(t=""), parameters)]
        finally:
            connection.close()

    return execute


def _live_flow(execute: Execute, node: str, flow_class: str) -> tuple[str, str]:
    """(flow id, flow class) of the first live, suspended flow of ``flow_class`` on ``node``."""
    found = execute(
        node,
        "SELECT flow_id, flow_class FROM {t}node_checkpoints WHERE status = 'SUSPENDED' "
        "AND flow_class LIKE :c ORDER BY flow_id",
        {"c": f"%.{flow_class}"},
    )
    assert found, (node, flow_class)
    return str(found[0][0]), str(found[0][1])


def _finished_flow(execute: Execute, node: str, flow_class: str) -> str:
    (found,) = execute(
        node,
        "SELECT flow_id FROM {t}node_flow_results WHERE flow_class LIKE :c",
        {"c": f"%.{flow_class}"},
    )
    return str(found[0])


def echo_session_of(execute: Execute) -> tuple[str, str]:
    """(Alice's echo flow, its session as Bob recorded it, without ``.r``)."""
    echo = _finished_flow(execute, ALICE, "EchoFlow")
    sessions = {
        str(row[0])
        for row in execute(BOB, "SELECT session_id FROM {t}node_message_ids", {})
        if first_session_of(echo, str(row[0])[: -len(".r")])
    }
    (session,) = sessions
    return echo, session[: -len(".r")]


def inject_checkpoint_without_blob(execute: Execute) -> Expected:
    """Bob's waiting LingeringResponder loses its blob (the row stays)."""
    flow, _ = _live_flow(execute, BOB, "LingeringResponder")
    execute(BOB, "DELETE FROM {t}node_checkpoint_blobs WHERE flow_id = :f", {"f": flow})
    return Expected("node_integrity", BOB, flow, "checkpoint_without_blob")


def inject_blob_without_checkpoint(execute: Execute) -> Expected:
    """Alice's sleeping LingeringFlow loses its checkpoint row (the blob stays).

    The flow consumed nothing (it sent its hello and sleeps), so no session end of Alice's
    loses its owner.
    """
    flow, _ = _live_flow(execute, ALICE, "LingeringFlow")
    execute(ALICE, "DELETE FROM {t}node_checkpoints WHERE flow_id = :f", {"f": flow})
    return Expected("node_integrity", ALICE, flow, "blob_without_checkpoint")


def inject_finished_and_live(execute: Execute, at_ms: int) -> Expected:
    """Alice's sleeping LingeringFlow gets a result row while its checkpoint stays."""
    flow, flow_class = _live_flow(execute, ALICE, "LingeringFlow")
    execute(
        ALICE,
        "INSERT INTO {t}node_flow_results (flow_id, flow_class, result, completed_at) "
        "VALUES (:f, :c, :r, :a)",
        {"f": flow, "c": flow_class, "r": b"\x00", "a": at_ms},
    )
    return Expected("node_integrity", ALICE, flow, "finished_and_live")


def inject_unowned_responder_end(execute: Execute) -> Expected:
    """Bob's finished EchoResponder loses its result row; its consumed messages remain."""
    _, session = echo_session_of(execute)
    responder = session_ids.responder_flow_id(ALICE, session)
    execute(BOB, "DELETE FROM {t}node_flow_results WHERE flow_id = :f", {"f": responder})
    return Expected("session_ownership", BOB, responder, "unowned")


def inject_unowned_initiator_end(execute: Execute) -> Expected:
    """Alice's finished EchoFlow loses its result row; the echoes it consumed remain."""
    echo, _ = echo_session_of(execute)
    execute(ALICE, "DELETE FROM {t}node_flow_results WHERE flow_id = :f", {"f": echo})
    return Expected("session_ownership", ALICE, echo, "unowned")


def _copy_record(execute: Execute, source: str, target: str, session: str, sequence: int) -> None:
    (row,) = execute(
        source,
        "SELECT message_id, sender, session_id, sequence, inserted_at FROM {t}node_message_ids "
        "WHERE session_id = :s AND sequence = :q",
        {"s": session, "q": sequence},
    )
    execute(
        target,
        "INSERT INTO {t}node_message_ids (message_id, sender, session_id, sequence, inserted_at) "
        "VALUES (:m, :s, :i, :q, :a)",
        dict(zip("msiqa", row, strict=True)),
    )


def inject_misdirected_responder_end(execute: Execute) -> Expected:
    """Charlie records the opening message of Alice's echo session to Bob (sequence 0).

    Only sequence 0, so without the sender's evidence it would pass as a session Charlie
    refused; Alice's tables show her end of it with counterparty Bob.
    """
    _, session = echo_session_of(execute)
    _copy_record(execute, BOB, CHARLIE, f"{session}.r", 0)
    flow = session_ids.responder_flow_id(ALICE, session)
    return Expected("session_ownership", CHARLIE, flow, "misdirected")


def unanswered_session(execute: Execute) -> tuple[str, str]:
    """(Alice's failed UnansweredFlow, its session as Bob recorded it, without ``.r``)."""
    (row,) = execute(
        ALICE,
        "SELECT flow_id FROM {t}node_flow_exceptions WHERE flow_class LIKE :c",
        {"c": "%.UnansweredFlow"},
    )
    flow = str(row[0])
    (session,) = {
        str(r[0])[: -len(".r")]
        for r in execute(BOB, "SELECT session_id FROM {t}node_message_ids", {})
        if first_session_of(flow, str(r[0])[: -len(".r")])
    }
    return flow, session


def inject_opening_recorded_twice(execute: Execute, refused: bool) -> str:
    """Charlie records, besides Bob, the opening message of a session Alice opened to Bob.

    The echo session (Bob holds its responder flow) or, with ``refused``, the session of
    UnansweredFlow (which Bob refused: neither holds a flow). Returns the session id.
    """
    _, session = unanswered_session(execute) if refused else echo_session_of(execute)
    _copy_record(execute, BOB, CHARLIE, f"{session}.r", 0)
    return session


def inject_misdirected_initiator_end(execute: Execute) -> Expected:
    """Charlie records Bob's first echo to Alice: an initiator end tagged with Alice's tag."""
    echo, session = echo_session_of(execute)
    _copy_record(execute, ALICE, CHARLIE, session, 0)
    return Expected("session_ownership", CHARLIE, echo, "misdirected")


def inject_reused_id(data: NetworkData) -> tuple[str, str, str]:
    """Bob's dedup table loses its primary key (a botched restore), and a record of another
    conversation reuses the id of the first message of the echo session, which stays healthy.

    Returns (the node, the reused id, the echo session as its initiator named it).
    """
    _, echo_session = echo_session_of(sqlite_execute(data))
    with sqlite3.connect(data.databases[BOB]) as bob:
        bob.execute("CREATE TABLE dedup_copy AS SELECT * FROM node_message_ids")
        bob.execute("DROP TABLE node_message_ids")
        bob.execute("ALTER TABLE dedup_copy RENAME TO node_message_ids")
        (reused,) = _one(
            bob,
            "SELECT message_id FROM node_message_ids WHERE session_id = ? AND sequence = 0",
            f"{echo_session}.r",
        )
        other, top, at = _one(
            bob,
            "SELECT session_id, max(sequence), max(inserted_at) FROM node_message_ids "
            "WHERE sender = ? AND session_id NOT LIKE ? GROUP BY session_id "
            "ORDER BY session_id LIMIT 1",
            ALICE,
            f"{echo_session}%",
        )
        bob.execute(
            "INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)",
            (reused, ALICE, other, int(str(top)) + 1, at),
        )
    bob.close()
    return BOB, str(reused), echo_session


def assert_same_findings(mine: Any, theirs: Any) -> None:
    """Two analyses (``AnalysisReport``) of the same nodes found the same: per check its
    status, summary, rows and every extra table's rows (e.g. from an export and from the
    databases)."""
    for check, other in zip(mine.checks, theirs.checks, strict=True):
        assert (check.name, check.status, check.summary) == (
            other.name,
            other.status,
            other.summary,
        )
        assert check.table.rows == other.table.rows, check.name
        assert {k: t.rows for k, t in check.extras.items()} == {
            k: t.rows for k, t in other.extras.items()
        }, check.name
