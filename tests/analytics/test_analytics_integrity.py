"""The table-only detections of issue 19: node integrity and session ownership.

Real flows on MockNetwork nodes (tests/analytics_data.py), each inconsistency injected alone
on a copy of the clean data (SQLite files, or PostgreSQL schemas copied per case): the check
must report exactly that finding (node, flow, kind) and nothing else, and the clean data
nothing at all. ``flow_counts`` must count a flow that is both finished and live once.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from flows.cli.analyze_keys import NodeKey, load_keys
from flows.cli.main import main as cli_main
from flows.testing import MockNetwork
from foundation.engine import normalize_url
from persistence.analytics import (
    CheckSettings,
    exactly_once_audit,
    find_jdbc_jars,
    load_nodes,
    node_integrity,
    parse_node_argument,
    run_checks,
    session_consistency,
    session_ownership,
)
from persistence.analytics.checks.exactly_once_audit import GAPS_LISTED
from persistence.analytics.sources import NodeSource
from samples.pingpong import PingFlow
from statemachine import session_ids
from tests.analytics_data import (
    ALICE,
    BOB,
    CHARLIE,
    CORDAPPS,
    NAMES,
    Execute,
    Expected,
    LingeringFlow,
    NetworkData,
    RefusalCaughtFlow,
    build_clean_network,
    copy_database,
    echo_session_of,
    inject_blob_without_checkpoint,
    inject_checkpoint_without_blob,
    inject_finished_and_live,
    inject_misdirected_initiator_end,
    inject_misdirected_responder_end,
    inject_opening_recorded_twice,
    inject_unowned_initiator_end,
    inject_unowned_responder_end,
    sqlite_execute,
    sqlite_files_execute,
    write_key_file,
)
from tests.conftest import POSTGRES_URL, database_for, require_service
from tests.cordapp import EchoFlow, UnansweredFlow

MINUTE_MS = 60_000
CHECKS = ("node_integrity", "session_ownership")
Injection = Callable[[Execute, int], Expected]
INJECTIONS: dict[str, Injection] = {
    "checkpoint_without_blob": lambda execute, _: inject_checkpoint_without_blob(execute),
    "blob_without_checkpoint": lambda execute, _: inject_blob_without_checkpoint(execute),
    "finished_and_live": inject_finished_and_live,
    "unowned_responder_end": lambda execute, _: inject_unowned_responder_end(execute),
    "unowned_initiator_end": lambda execute, _: inject_unowned_initiator_end(execute),
    "misdirected_responder_end": lambda execute, _: inject_misdirected_responder_end(execute),
    "misdirected_initiator_end": lambda execute, _: inject_misdirected_initiator_end(execute),
}


def require_jdbc() -> None:
    jars = find_jdbc_jars()
    missing = [d for d in ("sqlite", "postgresql") if jars.for_dialect(d) is None]
    require_service("JDBC drivers", f"no JDBC jar for {missing}" if missing else None)


def findings(
    spark: Any, sources: list[NodeSource], now_ms: int
) -> tuple[set[tuple[str, str, str, str]], dict[str, Any]]:
    """(check, node, flow id, kind) of every finding of the two checks, and their results."""
    settings = CheckSettings(as_of_ms=now_ms + MINUTE_MS, grace_ms=30_000)
    found: set[tuple[str, str, str, str]] = set()
    details: dict[str, Any] = {}
    with load_nodes(spark, sources) as snapshot:
        for result in run_checks(snapshot, settings, names=[*CHECKS, "flow_counts"]):
            rows = [row.asDict() for row in result.frame.collect()]
            details[result.name] = {"status": result.verdict.status, "rows": rows}
            if result.name in CHECKS:
                found |= {(result.name, r["node"], r["flow_id"], r["kind"]) for r in rows}
                summary = result.extras.get("summary")
                if summary is not None:
                    details[result.name]["summary"] = {row[0]: row[1] for row in summary.collect()}
    return found, details


# --- SQLite: the clean network of tests/analytics_data.py ------------------------------------


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> NetworkData:
    return build_clean_network(tmp_path_factory.mktemp("integrity-clean"))


def sqlite_sources(data: NetworkData) -> list[NodeSource]:
    return [parse_node_argument(s) for s in data.sources(NAMES)]


@pytest.mark.spark
def test_the_clean_network_gives_no_finding(spark: Any, clean: NetworkData) -> None:
    require_jdbc()
    found, details = findings(spark, sqlite_sources(clean), clean.now_ms)
    assert found == set()
    assert details["node_integrity"]["status"] == "ok"
    assert details["session_ownership"]["status"] == "ok"
    # UnansweredFlow's session was refused by Bob: its opening message recorded, no flow
    assert details["session_ownership"]["summary"] == {"owned": 36, "refused": 1}


@pytest.mark.spark
@pytest.mark.parametrize("case", sorted(INJECTIONS))
def test_each_injected_inconsistency_is_found_alone_on_sqlite(
    spark: Any, clean: NetworkData, tmp_path: Path, case: str
) -> None:
    require_jdbc()
    data = clean.copy_to(tmp_path / "copy")  # the module's clean data is never touched
    expected = INJECTIONS[case](sqlite_execute(data), data.now_ms)
    found, details = findings(spark, sqlite_sources(data), data.now_ms)
    assert found == {attrs.astuple(expected)}
    assert details[expected.check]["status"] == "fail"
    (row,) = details[expected.check]["rows"]
    assert row["reason"]
    if expected.kind == "misdirected":
        target = BOB if case == "misdirected_responder_end" else ALICE
        assert (row["sender"], row["target"]) == (
            ALICE if target == BOB else BOB,
            target,
        )
    classes = {
        "checkpoint_without_blob": "tests.analytics_data.LingeringResponder",
        "blob_without_checkpoint": "unknown",  # only the blob, which is not read, holds it
        "finished_and_live": "tests.analytics_data.LingeringFlow",
    }
    if expected.check == "node_integrity":
        assert row["flow_class"] == classes[case]


@pytest.mark.spark
@pytest.mark.parametrize(
    ("refused", "analyzed", "expected"),
    [
        # Bob holds the echo responder: Charlie took what was meant for him
        (False, (BOB, CHARLIE), {CHARLIE: ("misdirected", BOB)}),
        # Bob refused: neither holds a flow, and without Alice nothing says which was meant
        (True, (BOB, CHARLIE), {BOB: ("contested", CHARLIE), CHARLIE: ("contested", BOB)}),
        # Alice's tables name Bob (she consumed his rejection): Charlie alone is wrong
        (True, (ALICE, BOB, CHARLIE), {CHARLIE: ("misdirected", BOB)}),
    ],
    ids=["held-by-bob", "refused-sender-not-analyzed", "refused-sender-names-bob"],
)
def test_an_opening_message_consumed_by_two_nodes_is_a_finding_without_the_senders_tables(
    spark: Any,
    clean: NetworkData,
    tmp_path: Path,
    refused: bool,
    analyzed: tuple[str, ...],
    expected: dict[str, tuple[str, str]],
) -> None:
    """A session has one responder: two nodes recording its opening message is a broken
    promise even when the sender is down (its tables not analyzed) and the wrong node's
    record looks like a refusal."""
    require_jdbc()
    data = clean.copy_to(tmp_path / "copy")
    session = inject_opening_recorded_twice(sqlite_execute(data), refused)
    sources = [parse_node_argument(s) for s in data.sources(analyzed)]
    found, details = findings(spark, sources, data.now_ms)
    flow = session_ids.responder_flow_id(ALICE, session)
    assert found == {
        ("session_ownership", node, flow, kind) for node, (kind, _) in expected.items()
    }
    rows = details["session_ownership"]["rows"]
    assert {r["node"]: (r["kind"], r["target"]) for r in rows} == expected
    assert all(r["session_id"] == f"{session}.r" and r["sender"] == ALICE for r in rows)
    assert details["session_ownership"]["status"] == "fail"
    if refused and ALICE not in analyzed:
        assert "at most one of them was its target" in rows[0]["reason"]


@pytest.mark.spark
def test_a_flow_finished_and_live_is_counted_once_as_finished(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    require_jdbc()
    data = clean.copy_to(tmp_path / "copy")
    before = counts(findings(spark, sqlite_sources(data), data.now_ms)[1])
    inject_finished_and_live(sqlite_execute(data), data.now_ms)
    after = counts(findings(spark, sqlite_sources(data), data.now_ms)[1])
    key = (ALICE, "tests.analytics_data.LingeringFlow")
    assert after[(*key, "SUSPENDED")] == before[(*key, "SUSPENDED")] - 1
    assert after.get((*key, "COMPLETED"), 0) == before.get((*key, "COMPLETED"), 0) + 1
    assert sum(after.values()) == sum(before.values())


def counts(details: dict[str, Any]) -> dict[tuple[str, str, str], int]:
    return {
        (r["node"], r["flow_class"], r["status"]): r["flows"]
        for r in details["flow_counts"]["rows"]
    }


# --- PostgreSQL: one schema per node, each case on copied schemas -----------------------------


@attrs.frozen
class PostgresNetwork:
    engine: Engine
    schemas: dict[str, str]
    now_ms: int


def copy_schemas(engine: Engine, schemas: dict[str, str], suffix: str) -> dict[str, str]:
    """Copy every node schema (tables, keys, rows) to ``<schema>_<suffix>``."""
    copies = {}
    with engine.begin() as connection:
        for name, schema in schemas.items():
            copy = f"{schema}_{suffix}"
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{copy}" CASCADE'))
            connection.execute(text(f'CREATE SCHEMA "{copy}"'))
            tables = connection.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema}
            ).scalars()
            for table in list(tables):
                connection.execute(
                    text(
                        f'CREATE TABLE "{copy}"."{table}" (LIKE "{schema}"."{table}" INCLUDING ALL)'
                    )
                )
                connection.execute(
                    text(f'INSERT INTO "{copy}"."{table}" SELECT * FROM "{schema}"."{table}"')
                )
            copies[name] = copy
    return copies


@contextlib.contextmanager
def copies_dropped_after(schemas: dict[str, str]) -> Iterator[Engine]:
    """An engine on the test database; every ``<schema>_*`` copy of ``schemas`` dropped after."""
    engine = create_engine(normalize_url(POSTGRES_URL))
    try:
        yield engine
    finally:
        with engine.begin() as connection:
            for schema in schemas.values():
                for (copy,) in connection.execute(
                    text("SELECT nspname FROM pg_namespace WHERE nspname LIKE :p"),
                    {"p": f"{schema}\\_%"},
                ):
                    connection.execute(text(f'DROP SCHEMA "{copy}" CASCADE'))
        engine.dispose()


def postgres_execute(engine: Engine, schemas: dict[str, str]) -> Execute:
    def execute(node: str, sql: str, parameters: dict[str, object]) -> list[tuple[Any, ...]]:
        with engine.begin() as connection:
            result = connection.execute(text(sql.format(t=f'"{schemas[node]}".')), parameters)
            return [tuple(r) for r in result] if result.returns_rows else []

    return execute


def postgres_sources(schemas: dict[str, str]) -> list[NodeSource]:
    return [
        parse_node_argument(f"{name}={POSTGRES_URL}?schema={schema}")
        for name, schema in schemas.items()
    ]


@pytest.fixture(scope="module")
def postgres_network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresNetwork]:
    url = database_for("postgresql")
    directory = tmp_path_factory.mktemp("integrity-postgres")
    with MockNetwork(cordapps=CORDAPPS, directory=directory, database=url) as network:
        alice, bob, charlie = (network.create_node(name) for name in (ALICE, BOB, CHARLIE))
        for _ in range(2):
            alice.start_flow(PingFlow(bob.party))
            alice.start_flow(LingeringFlow(bob.party))
        alice.start_flow(PingFlow(charlie.party))
        alice.start_flow(EchoFlow(bob.party, ["one", "two", "three"]))
        alice.start_flow(UnansweredFlow(bob.party))  # refused by Bob: not a finding
        network.run_network(advance_clock=False)
        now_ms = round(network.clock.now() * 1000)
        schemas = {m.name: str(m.config.database_schema) for m in network.nodes}
        with copies_dropped_after(schemas) as engine:
            yield PostgresNetwork(engine, schemas, now_ms)


@pytest.mark.spark
def test_postgresql_nodes_clean_give_nothing_and_each_injection_its_finding(
    spark: Any, postgres_network: PostgresNetwork
) -> None:
    require_jdbc()
    net = postgres_network
    found, details = findings(spark, postgres_sources(net.schemas), net.now_ms)
    assert found == set()
    assert details["session_ownership"]["summary"]["refused"] == 1
    for index, case in enumerate(sorted(INJECTIONS)):
        copies = copy_schemas(net.engine, net.schemas, f"c{index}")
        expected = INJECTIONS[case](postgres_execute(net.engine, copies), net.now_ms)
        found, _ = findings(spark, postgres_sources(copies), net.now_ms)
        assert found == {attrs.astuple(expected)}, case


@pytest.mark.spark
def test_a_flow_finished_and_live_on_postgresql_is_counted_once_as_finished(
    spark: Any, postgres_network: PostgresNetwork
) -> None:
    require_jdbc()
    net = postgres_network
    before = counts(findings(spark, postgres_sources(net.schemas), net.now_ms)[1])
    copies = copy_schemas(net.engine, net.schemas, "f0")
    inject_finished_and_live(postgres_execute(net.engine, copies), net.now_ms)
    after = counts(findings(spark, postgres_sources(copies), net.now_ms)[1])
    key = (ALICE, "tests.analytics_data.LingeringFlow")
    assert after[(*key, "SUSPENDED")] == before[(*key, "SUSPENDED")] - 1
    assert after.get((*key, "COMPLETED"), 0) == before.get((*key, "COMPLETED"), 0) + 1
    assert sum(after.values()) == sum(before.values())


@pytest.mark.spark
def test_an_opening_message_consumed_by_two_postgresql_nodes_is_a_finding(
    spark: Any, postgres_network: PostgresNetwork
) -> None:
    """The SQLite test's three cases above, on copied PostgreSQL schemas."""
    require_jdbc()
    net = postgres_network
    cases = [
        (False, (BOB, CHARLIE), {CHARLIE: ("misdirected", BOB)}),
        (True, (BOB, CHARLIE), {BOB: ("contested", CHARLIE), CHARLIE: ("contested", BOB)}),
        (True, (ALICE, BOB, CHARLIE), {CHARLIE: ("misdirected", BOB)}),
    ]
    for index, (refused, analyzed, expected) in enumerate(cases):
        copies = copy_schemas(net.engine, net.schemas, f"t{index}")
        session = inject_opening_recorded_twice(postgres_execute(net.engine, copies), refused)
        sources = postgres_sources({name: copies[name] for name in analyzed})
        found, details = findings(spark, sources, net.now_ms)
        flow = session_ids.responder_flow_id(ALICE, session)
        assert found == {
            ("session_ownership", node, flow, kind) for node, (kind, _) in expected.items()
        }, (refused, analyzed)
        rows = details["session_ownership"]["rows"]
        assert {r["node"]: (r["kind"], r["target"]) for r in rows} == expected
        assert details["session_ownership"]["status"] == "fail"


@pytest.mark.spark
def test_a_responder_that_answered_and_lost_its_result_is_an_orphan_not_a_refusal(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    """Bob's EchoResponder answered Alice's four words, then its result row was lost.

    Both flows finished; Bob consumed the opening message and holds no flow for it, as a
    node that refused the session would. But a refusal is one message, and Alice took in
    five from Bob's end: his responder ran, and its row is gone.
    """
    require_jdbc()
    data = clean.copy_to(tmp_path / "copy")
    with sqlite3.connect(data.databases[BOB]) as bob:
        ((responder,),) = bob.execute(
            "SELECT flow_id FROM node_flow_results WHERE flow_class LIKE '%.EchoResponder'"
        ).fetchall()
        bob.execute("DELETE FROM node_flow_results WHERE flow_id = ?", (responder,))
    bob.close()
    settings = CheckSettings(as_of_ms=data.now_ms + MINUTE_MS, grace_ms=30_000)
    with load_nodes(spark, sqlite_sources(data)) as snapshot:
        result = session_consistency(snapshot, settings)
        rows = [row.asDict() for row in result.frame.collect()]
    assert result.verdict.status == "fail", result.verdict.summary
    found = [(r["node"], r["outcome"], r["counterparty"], r["counterpart_flow_id"]) for r in rows]
    assert found == [(ALICE, "orphan", BOB, responder)]


@pytest.mark.spark
def test_records_numbered_below_zero_or_near_2_63_are_findings_not_a_crash(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    """Three corrupt records on Bob, each of a session Alice opened with him.

    Message 1 of the echo session rewritten as number -1 (its id to match): a bad number,
    and the gap it leaves is still found. A record numbered 3,000,000,000 and one numbered
    2**63 - 1 on two lingering sessions: gaps, listed up to GAPS_LISTED a session, not an
    array of billions nor an overflow that stopped the whole analysis. Their senders' rows say
    they sent one message each: the two records are also of messages nobody sent
    (``consumed_unsent``, from the session facts).
    """
    require_jdbc()
    data = clean.copy_to(tmp_path / "copy")
    first, second = [
        one for one in data.lingering if (one.initiator_node, one.responder_node) == (ALICE, BOB)
    ][:2]
    echo = data.echo_session
    at = data.now_ms - 10 * MINUTE_MS
    with sqlite3.connect(data.databases[BOB]) as bob:
        bob.execute(
            "UPDATE node_message_ids SET message_id = ?, sequence = -1 "
            "WHERE session_id = ? AND sequence = 1",
            (f"N-{echo}--1", f"{echo}.r"),
        )
        for lingering, number in ((first, 3_000_000_000), (second, 2**63 - 1)):
            bob.execute(
                "INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)",
                (f"N-{lingering.session}-{number}", ALICE, f"{lingering.session}.r", number, at),
            )
    bob.close()
    settings = CheckSettings(as_of_ms=data.now_ms + MINUTE_MS, grace_ms=30_000)
    with load_nodes(spark, sqlite_sources(data)) as snapshot:
        results = {result.name: result for result in run_checks(snapshot, settings)}
        audit = results["exactly_once_audit"]
        rows = [row.asDict() for row in audit.frame.collect()]
        total = audit.verdict.findings
    assert audit.verdict.status == "fail"
    assert sorted(
        (r["kind"], r["session_id"], r["sequence"]) for r in rows if r["kind"] != "sequence_gap"
    ) == sorted(
        [
            ("bad_sequence", f"{echo}.r", -1),
            ("consumed_unsent", f"{first.session}.r", 3_000_000_000),
            ("consumed_unsent", f"{second.session}.r", 2**63 - 1),
        ]
    )
    gaps = {}
    for row in rows:
        if row["kind"] == "sequence_gap":
            gaps.setdefault(row["session_id"], []).append(row)
    assert [r["sequence"] for r in gaps[f"{echo}.r"]] == [1]
    for lingering in (first, second):
        listed = gaps[f"{lingering.session}.r"]
        assert [r["sequence"] for r in listed] == list(range(1, GAPS_LISTED + 1))
        assert " missing in the session; the first 1000 are listed" in listed[0]["detail"]
    assert total == 1 + 1 + 2 * GAPS_LISTED + 2


# --- a sender that is down: its old outbox rows wait (warn), nothing is broken --------------


@pytest.mark.spark
@pytest.mark.parametrize("sender_ran_since", [False, True])
def test_an_old_outbox_row_is_a_warning_naming_when_its_sender_was_alive(
    spark: Any, clean: NetworkData, tmp_path: Path, sender_ran_since: bool
) -> None:
    """Alice committed a send ten minutes ago and died before her relay handed it over.

    What a node that died at that boundary leaves: the row waits in her outbox and is sent
    at her next start; the target, had it taken it, drops the copy by its id. (With her
    node running, the target may be unreachable, or share no key with her yet: the row is
    retried.) Nothing is lost or done twice, so the audit warns; it fails on the same data
    with a message consumed twice.
    """
    require_jdbc()
    data = clean.copy_to(tmp_path / "copy")
    (lingering, *_) = [
        one for one in data.lingering if (one.initiator_node, one.responder_node) == (ALICE, BOB)
    ]
    written_ms = data.now_ms - 10 * MINUTE_MS
    last_alive_ms = written_ms + (5 * MINUTE_MS if sender_ran_since else 2_000)
    with sqlite3.connect(data.databases[ALICE]) as alice:
        alice.execute(
            "INSERT INTO node_outbox VALUES (?, ?, ?, ?)",
            (f"N-{lingering.session}-1", BOB, b"goodbye", written_ms),
        )
        alice.execute("UPDATE node_workers SET renewed_at = ?", (last_alive_ms,))
    alice.close()
    settings = CheckSettings(as_of_ms=data.now_ms, grace_ms=30_000)
    with load_nodes(spark, sqlite_sources(data)) as snapshot:
        result = exactly_once_audit(snapshot, settings)
        (row,) = [r.asDict() for r in result.frame.collect()]
    assert result.verdict.status == "warn", result.verdict.summary
    assert "wait in their sender's outbox" in result.verdict.summary
    assert (row["kind"], row["node"], row["counterparty"]) == ("undelivered", ALICE, BOB)
    assert "not consumed by" in row["detail"]
    assert "the sender was last alive at" in row["detail"]
    assert ("down since it wrote the row" in row["detail"]) is not sender_ran_since
    with sqlite3.connect(data.databases[BOB]) as bob:  # and a message consumed twice
        bob.execute("CREATE TABLE ids AS SELECT * FROM node_message_ids")
        bob.execute("DROP TABLE node_message_ids")
        bob.execute("ALTER TABLE ids RENAME TO node_message_ids")
        bob.execute("INSERT INTO node_message_ids SELECT * FROM node_message_ids LIMIT 1")
    bob.close()
    with load_nodes(spark, sqlite_sources(data)) as snapshot:
        assert exactly_once_audit(snapshot, settings).verdict.status == "fail"


@pytest.mark.spark
@pytest.mark.parametrize("end", ["initiator", "responder"])
def test_an_outbox_row_written_after_its_flow_ended_is_a_finding(
    spark: Any, clean: NetworkData, tmp_path: Path, end: str
) -> None:
    """A row in Alice's (or Bob's) outbox for the finished echo conversation, written half
    an hour after the flow that owns its session ended: no flow wrote it (a flow's messages
    are written in its own transactions, its last ones with its end)."""
    require_jdbc()
    data = clean.copy_to(tmp_path / "copy")
    echo, session = echo_session_of(sqlite_execute(data))
    written_ms = data.now_ms + 30 * MINUTE_MS
    sender, target, message, flow = (
        (ALICE, BOB, f"N-{session}-9", echo)
        if end == "initiator"
        else (BOB, ALICE, f"N-{session}.r-9", session_ids.responder_flow_id(ALICE, session))
    )
    with sqlite3.connect(data.databases[sender]) as connection:
        connection.execute(
            "INSERT INTO node_outbox VALUES (?, ?, ?, ?)", (message, target, b"x", written_ms)
        )
    connection.close()
    settings = CheckSettings(as_of_ms=data.now_ms + 60 * MINUTE_MS, grace_ms=30_000)
    with load_nodes(spark, sqlite_sources(data)) as snapshot:
        result = exactly_once_audit(snapshot, settings)
        (row,) = [r.asDict() for r in result.frame.collect()]
    assert result.verdict.status == "fail", result.verdict.summary
    assert (row["kind"], row["node"], row["counterparty"], row["message_ids"]) == (
        "written_after_end",
        sender,
        target,
        message,
    )
    assert f"but its flow {flow} had ended at" in row["detail"]


# --- a counterparty that is down: not delivered yet (warn) versus orphan (fail) ---------------


@attrs.frozen
class DownNetwork:
    """Alice pinged Bob while Bob was not running: the ping waits in the transport."""

    databases: dict[str, Path]
    now_ms: int
    session: str
    """Alice's end of the waiting ping's session."""
    keys: dict[str, Path]
    """Each node's key file (for the blob check)."""


def ping_a_down_node(network: MockNetwork) -> tuple[str, int]:
    """Alice pings Bob twice, the second time with Bob down: (the waiting flow, mock now ms)."""
    alice, bob = network.create_node(ALICE), network.create_node(BOB)
    alice.start_flow(PingFlow(bob.party))  # answered: Bob recorded a message from Alice
    network.run_network(advance_clock=False)
    waiting = alice.start_flow(PingFlow(bob.party)).flow_id
    while alice.run_once():  # only Alice runs: Bob is down, the ping stays in transport
        pass
    return waiting, round(network.clock.now() * 1000)


@pytest.fixture(scope="module")
def down_network(tmp_path_factory: pytest.TempPathFactory) -> DownNetwork:
    directory = tmp_path_factory.mktemp("integrity-down")
    with MockNetwork(cordapps=CORDAPPS, directory=directory / "run") as network:
        waiting, now_ms = ping_a_down_node(network)
        keys = {m.name: write_key_file(m, directory / "keys") for m in network.nodes}
        databases = {}
        for mock in network.nodes:
            source = Path(mock.config.database_url.removeprefix("sqlite:///"))
            databases[mock.name] = directory / source.name
            backup = sqlite3.connect(databases[mock.name])
            live = sqlite3.connect(source)
            try:
                live.backup(backup)
            finally:
                live.close()
                backup.close()
    with sqlite3.connect(databases[ALICE]) as connection:
        (session,) = [
            str(s)
            for (s,) in connection.execute(
                "SELECT waiting_for FROM node_checkpoints WHERE flow_id = ?", (waiting,)
            )
        ]
    connection.close()
    return DownNetwork(databases, now_ms, json.loads(session)[0]["session"], keys)


def bob_was(
    down: DownNetwork, directory: Path, last_alive_ms: int | None, heard_ms: int | None = None
) -> list[NodeSource]:
    """A copy where Bob's lease row was last renewed at ``last_alive_ms`` (None: no row).

    The flow tables of a MockNetwork use the mock clock and the lease the database's clock,
    so the test puts the lease in mock-clock time, as a node that crashed then would have
    left it. ``heard_ms``: Bob recorded the answered ping from Alice then.
    """
    directory.mkdir()
    sources = []
    for name, path in down.databases.items():
        copy = directory / path.name
        shutil.copyfile(path, copy)
        sources.append(parse_node_argument(f"{name}=sqlite:///{copy}"))
        if name != BOB:
            continue
        with sqlite3.connect(copy) as connection:
            if last_alive_ms is None:
                connection.execute("DELETE FROM node_workers")
            else:
                connection.execute(
                    "UPDATE node_workers SET renewed_at = ?, expires_at = ?",
                    (last_alive_ms, last_alive_ms + 10_000),
                )
            if heard_ms is not None:
                connection.execute("UPDATE node_message_ids SET inserted_at = ?", (heard_ms,))
        connection.close()
    return sources


DOWN_CASES = [
    ("down since before the send", "not delivered yet", "warn"),
    ("no lease row", "unconfirmed", "warn"),
    # running is not receiving: a node catching up on a backlog after a restart renews
    # its lease and records other messages of ours before it reaches this one
    ("alive well after the send", "unconfirmed", "warn"),
    ("recorded later traffic from us", "unconfirmed", "warn"),
]


def bob_lease(case: str, now_ms: int) -> tuple[int | None, int | None]:
    """(Bob's lease last renewed at or None for no row, Bob heard Alice at or None) for a case."""
    as_of = now_ms + 10 * MINUTE_MS
    return {
        "down since before the send": (now_ms - 5 * MINUTE_MS, None),
        "no lease row": (None, None),
        "alive well after the send": (as_of - 10_000, None),
        "recorded later traffic from us": (now_ms - 5 * MINUTE_MS, now_ms + MINUTE_MS),
    }[case]


def assert_waiting_ping(
    spark: Any,
    sources: list[NodeSource],
    session: str,
    now_ms: int,
    case: str,
    outcome: str,
    status: str,
) -> None:
    """Alice's waiting ping is one finding with ``outcome``; nothing else anywhere, and no
    check fails (the command would exit 0)."""
    settings = CheckSettings(as_of_ms=now_ms + 10 * MINUTE_MS, grace_ms=30_000)
    with load_nodes(spark, sources) as snapshot:
        results = {result.name: result for result in run_checks(snapshot, settings)}
        result = results["session_consistency"]
        rows = [row.asDict() for row in result.frame.collect()]
        summary = {row[0]: row[1] for row in result.extras["summary"].collect()}
    assert results["node_integrity"].verdict.status == "ok"
    assert results["session_ownership"].verdict.status == "ok"
    assert results["exactly_once_audit"].verdict.status == "ok"
    failed = [name for name, r in results.items() if r.verdict.status == "fail"]
    assert failed == [], {name: results[name].verdict.summary for name in failed}
    (row,) = rows
    assert (row["node"], row["session_id"], row["counterparty"], row["outcome"]) == (
        ALICE,
        session,
        BOB,
        outcome,
    )
    assert result.verdict.status == status
    assert summary[outcome] == 1
    assert "without a counterpart the tables cannot call lost" in result.verdict.summary
    assert row["waited_ms"] == 10 * MINUTE_MS
    if outcome == "not delivered yet":
        assert f"waits in the transport to {BOB} (last alive at" in row["problem"]
    elif outcome == "unconfirmed" and case != "no lease row":
        assert f"not consumed by {BOB}, which ran since the send" in row["problem"]
        assert "the transport's queues tell" in row["problem"]


@pytest.mark.spark
@pytest.mark.parametrize(("case", "outcome", "status"), DOWN_CASES)
def test_a_ping_to_a_down_node_is_a_warning_until_it_consumes_the_opening_message(
    spark: Any, down_network: DownNetwork, tmp_path: Path, case: str, outcome: str, status: str
) -> None:
    require_jdbc()
    down = down_network
    alive, heard = bob_lease(case, down.now_ms)
    sources = bob_was(down, tmp_path / "copy", alive, heard)
    assert_waiting_ping(spark, sources, down.session, down.now_ms, case, outcome, status)


@pytest.mark.spark
@pytest.mark.parametrize("case", ["down since before the send", "no lease row"])
def test_the_command_on_a_down_nodes_network_with_every_key_exits_zero(
    spark: Any, down_network: DownNetwork, tmp_path: Path, case: str
) -> None:
    """``fiberflow analyze``, every check and both nodes' keys (the blob check opens every
    blob): a node that is merely down is a warning, never a broken promise."""
    require_jdbc()
    down = down_network
    alive, heard = bob_lease(case, down.now_ms)
    sources = bob_was(down, tmp_path / "copy", alive, heard)
    argv = ["analyze", "--as-of", str(down.now_ms + 10 * MINUTE_MS), "--grace", "30s"]
    for source in sources:
        argv += ["--node", f"{source.name}={source.url}"]
    for name, path in down.keys.items():
        argv += ["--key-file", f"{name}={path}"]
    argv += ["--json", str(tmp_path / "r.json")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(argv)
    assert code == 0, out.getvalue()
    report = json.loads((tmp_path / "r.json").read_text())
    statuses = {check["name"]: check["status"] for check in report["checks"]}
    assert statuses["session_consistency"] == "warn", statuses
    assert statuses["checkpoint_blobs"] == "ok", statuses  # opened, not "not checked"
    assert "fail" not in statuses.values(), statuses


@attrs.frozen
class PostgresDownNetwork:
    """The down network on PostgreSQL: one schema per node."""

    engine: Engine
    schemas: dict[str, str]
    now_ms: int
    session: str


@pytest.fixture(scope="module")
def postgres_down_network(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PostgresDownNetwork]:
    url = database_for("postgresql")
    directory = tmp_path_factory.mktemp("integrity-down-postgres")
    with MockNetwork(cordapps=CORDAPPS, directory=directory, database=url) as network:
        waiting, now_ms = ping_a_down_node(network)
        schemas = {m.name: str(m.config.database_schema) for m in network.nodes}
        with copies_dropped_after(schemas) as engine:
            with engine.begin() as connection:
                (waiting_for,) = connection.execute(
                    text(
                        f'SELECT waiting_for FROM "{schemas[ALICE]}".node_checkpoints '
                        "WHERE flow_id = :f"
                    ),
                    {"f": waiting},
                ).scalars()
            if isinstance(waiting_for, str):
                waiting_for = json.loads(waiting_for)
            yield PostgresDownNetwork(engine, schemas, now_ms, waiting_for[0]["session"])


@pytest.mark.spark
@pytest.mark.parametrize(("case", "outcome", "status"), DOWN_CASES)
def test_a_ping_to_a_down_postgresql_node_is_a_warning_until_it_consumes_it(
    spark: Any,
    postgres_down_network: PostgresDownNetwork,
    case: str,
    outcome: str,
    status: str,
) -> None:
    require_jdbc()
    down = postgres_down_network
    copies = copy_schemas(
        down.engine, down.schemas, f"d{DOWN_CASES.index((case, outcome, status))}"
    )
    alive, heard = bob_lease(case, down.now_ms)
    bob = f'"{copies[BOB]}"'
    with down.engine.begin() as connection:
        if alive is None:
            connection.execute(text(f"DELETE FROM {bob}.node_workers"))
        else:
            connection.execute(
                text(f"UPDATE {bob}.node_workers SET renewed_at = :r, expires_at = :e"),
                {"r": alive, "e": alive + 10_000},
            )
        if heard is not None:
            connection.execute(
                text(f"UPDATE {bob}.node_message_ids SET inserted_at = :h"), {"h": heard}
            )
    sources = postgres_sources(copies)
    assert_waiting_ping(spark, sources, down.session, down.now_ms, case, outcome, status)


@pytest.mark.spark
def test_a_refusal_the_initiating_flow_caught_is_a_refusal_not_an_orphan(
    spark: Any, tmp_path: Path
) -> None:
    """Bob has no responder and refuses; Alice's flow catches the refusal and goes on living.

    Her checkpoint row's session facts say the session was never confirmed: a refusal
    (``ok (refused)``), not a responder that answered once and lost its rows (without the
    facts, ``refused or lost``: tests/analytics/test_analytics_facts.py).
    """
    require_jdbc()
    with MockNetwork(cordapps=CORDAPPS, directory=tmp_path / "run") as network:
        alice, bob = network.create_node(ALICE), network.create_node(BOB)
        handle = alice.start_flow(RefusalCaughtFlow(bob.party))
        network.run_network(advance_clock=False)
        assert not handle.done()  # asleep for a day, no longer waiting on the refused session
        now_ms = round(network.clock.now() * 1000)
        sources = []
        for mock in network.nodes:
            source = Path(mock.config.database_url.removeprefix("sqlite:///"))
            copy = tmp_path / source.name
            copy_database(source, copy)
            sources.append(parse_node_argument(f"{mock.name}=sqlite:///{copy}"))
    settings = CheckSettings(as_of_ms=now_ms + 10 * MINUTE_MS, grace_ms=30_000)
    with load_nodes(spark, sources) as snapshot:
        result = session_consistency(snapshot, settings)
        summary = {row[0]: row[1] for row in result.extras["summary"].collect()}
        rows = result.frame.collect()
        assert session_ownership(snapshot, settings).verdict.status == "ok"
        assert node_integrity(snapshot, settings).verdict.status == "ok"
    assert result.verdict.status == "ok", result.verdict.summary
    assert summary == {"ok (refused)": 1, "ok": 1}  # Bob's end: her flow is known
    assert rows == []


# --- one network, nodes on SQLite and on PostgreSQL ------------------------------------------


@pytest.mark.spark
def test_sqlite_and_postgresql_nodes_of_one_network_are_judged_as_one(
    spark: Any, tmp_path: Path
) -> None:
    """Alice and Charlie on SQLite files, Bob in a PostgreSQL schema, as an operator's
    network may be: clean, every check with every key passes (no failure, the blobs
    opened); each table-only fault, injected on a copy of the three, gives its finding."""
    require_jdbc()
    url = database_for("postgresql")
    with MockNetwork(cordapps=CORDAPPS, directory=tmp_path / "run") as network:
        alice = network.create_node(ALICE)
        bob = network.create_node(BOB, database=url)
        charlie = network.create_node(CHARLIE)
        assert bob.config.database_schema and not alice.config.database_schema
        for _ in range(2):
            alice.start_flow(PingFlow(bob.party))
            alice.start_flow(LingeringFlow(bob.party))
        alice.start_flow(PingFlow(charlie.party))
        alice.start_flow(EchoFlow(bob.party, ["one", "two", "three"]))
        alice.start_flow(UnansweredFlow(bob.party))
        network.run_network(advance_clock=False)
        now_ms = round(network.clock.now() * 1000)
        keys = {m.name: write_key_file(m, tmp_path / "keys") for m in network.nodes}
        files = {
            m.name: Path(m.config.database_url.removeprefix("sqlite:///")) for m in (alice, charlie)
        }
        schemas = {BOB: str(bob.config.database_schema)}
        with copies_dropped_after(schemas) as engine:

            def mixed_copy(suffix: str) -> tuple[Execute, list[NodeSource]]:
                """Copies of the three stores: a statement runner on them, and their sources."""
                copies = {}
                for name, source in files.items():
                    copies[name] = tmp_path / suffix / source.name
                    copies[name].parent.mkdir(exist_ok=True)
                    copy_database(source, copies[name])
                on_postgres = postgres_execute(engine, copy_schemas(engine, schemas, suffix))
                on_sqlite = sqlite_files_execute(copies)

                def execute(node: str, sql: str, parameters: dict[str, object]) -> Any:
                    return (on_postgres if node == BOB else on_sqlite)(node, sql, parameters)

                sources = [parse_node_argument(f"{n}=sqlite:///{p}") for n, p in copies.items()]
                sources += postgres_sources({BOB: f"{schemas[BOB]}_{suffix}"})
                return execute, sources

            _, sources = mixed_copy("clean")
            settings = CheckSettings(as_of_ms=now_ms + MINUTE_MS, grace_ms=30_000)
            with load_nodes(spark, sources) as snapshot:
                snapshot.checkpoint_keys = load_keys(
                    [NodeKey(name, path) for name, path in keys.items()]
                )
                statuses = {r.name: r.verdict.status for r in run_checks(snapshot, settings)}
            assert statuses["checkpoint_blobs"] == "ok", statuses
            for check in ("session_consistency", "exactly_once_audit", *CHECKS):
                assert statuses[check] == "ok", (check, statuses)
            for index, case in enumerate(sorted(INJECTIONS)):
                execute, sources = mixed_copy(f"m{index}")
                expected = INJECTIONS[case](execute, now_ms)
                found, details = findings(spark, sources, now_ms)
                assert found == {attrs.astuple(expected)}, case
                assert details[expected.check]["status"] == "fail", case
