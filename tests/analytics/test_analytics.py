"""Spark checkpoint analytics: real flows on MockNetwork nodes, clean and corrupted on purpose.

The clean network (tests/analytics_data.py) must give no finding in the consistency checks;
the corrupted copy (a deleted counterpart, a message consumed twice under two ids, one
recorded twice where the primary key was lost, a lost dedup id, an undelivered outbox row, a
flow waiting on a dead node) must give exactly those findings, through JDBC and through the
Arrow fallback alike. Spark runs once for the whole test session (the ``spark`` fixture).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from flows.cli.analyze import parse_duration, parse_moment
from flows.cli.main import main as cli_main
from flows.testing import MockNetwork
from foundation.engine import normalize_url
from persistence.analytics import (
    AnalysisReport,
    CheckSettings,
    NodeArgumentError,
    analyze,
    find_jdbc_jars,
    load_nodes,
    parse_node_argument,
    session_consistency,
)
from persistence.analytics.reading import range_predicates
from persistence.analytics.report import Table, text_table
from persistence.analytics.report_html import render_html
from persistence.analytics.session_columns import (
    counterpart_flow,
    expected_message_id,
    initiator_session,
    is_responder,
    message_sequence,
    message_session,
    peer_session,
    responder_flow_id,
    session_flow,
)
from samples.pingpong import PingFlow
from statemachine import session_ids
from statemachine.session_ids import (
    RESPONDER_NAMESPACE,
    flow_id_of_session,
    identity_tag,
    initiator_session_id,
    is_responder_session_id,
    message_id,
    peer_session_id,
    responder_session_id,
)
from tests.analytics_data import (
    ALICE,
    BOB,
    CHARLIE,
    CORDAPPS,
    DAVE,
    NAMES,
    Injected,
    LingeringFlow,
    NetworkData,
    build_clean_network,
    corrupt,
)
from tests.conftest import (
    POSTGRES_URL,
    database_for,
    postgres_driver_problem,
    require_service,
)

SETTINGS_MINUTE = 60_000
JARS = find_jdbc_jars()


def settings_for(data: NetworkData) -> CheckSettings:
    """Judge a minute after the mock clock stopped; cross-node grace 30 s."""
    return CheckSettings(as_of_ms=data.now_ms + SETTINGS_MINUTE, grace_ms=30_000)


def require_jdbc() -> None:
    missing = [d for d in ("sqlite", "postgresql") if JARS.for_dialect(d) is None]
    problem = None
    if missing:
        problem = (
            f"no JDBC jar for {', '.join(missing)} "
            "(apt-get install libpostgresql-jdbc-java libxerial-sqlite-jdbc-java)"
        )
    require_service("JDBC drivers", problem)


def rows(report: AnalysisReport, check: str, extra: str | None = None) -> list[dict[str, Any]]:
    found = report.check(check)
    table = found.extras[extra] if extra else found.table
    assert table.total == len(table.rows)
    return [dict(zip(table.columns, row, strict=True)) for row in table.rows]


def json_rows(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    (found,) = [c for c in report["checks"] if c["name"] == check]
    table = found["table"]
    return [dict(zip(table["columns"], row, strict=True)) for row in table["rows"]]


# --- without Spark ----------------------------------------------------------------------------


def test_node_arguments_take_x500_names_and_postgresql_schemas() -> None:
    source = parse_node_argument("O=Alice,L=London,C=GB=sqlite:///alice.db")
    assert (source.name, source.url, source.schema, source.dialect) == (
        "O=Alice,L=London,C=GB",
        "sqlite:///alice.db",
        None,
        "sqlite",
    )
    source = parse_node_argument(
        "O=Bob,L=Paris,C=FR=postgresql://u:secret@db:5433/nodes?schema=bob"
    )
    assert source.schema == "bob" and source.dialect == "postgresql"
    assert "schema" not in source.url and "secret" in source.url
    assert "secret" not in source.display_url() and source.display_url().endswith("?schema=bob")
    bare = parse_node_argument("sqlite:///alice.db")  # named from the other nodes' tables
    assert (bare.name, bare.url, bare.named) == ("sqlite:///alice.db", "sqlite:///alice.db", False)
    bare = parse_node_argument("postgresql://u:secret@db/nodes?schema=bob")
    assert (bare.schema, bare.named, bare.name) == (
        "bob",
        False,
        "postgresql://u:***@db/nodes?schema=bob",
    )
    for bad in (
        "O=Alice=mysql://x/y",
        "mysql://x/y",
        "O=A=sqlite:///a.db?schema=x",
        "alice.db",
        "O=Alice",
        "sqlite://",
    ):
        with pytest.raises(NodeArgumentError):
            parse_node_argument(bad)


def test_durations_and_moments_parse() -> None:
    assert [parse_duration(t) for t in ("90s", "10m", "2h", "1d", "250ms", "5")] == [
        90_000,
        600_000,
        7_200_000,
        86_400_000,
        250,
        5_000,
    ]
    assert parse_moment("2027-01-15T08:00:00Z") == 1_800_000_000_000
    assert parse_moment("1800000000000") == 1_800_000_000_000


def test_jdbc_jars_are_found_by_name_and_missing_ones_are_none(tmp_path: Path) -> None:
    (tmp_path / "postgresql-42.5.5.jar").write_bytes(b"")
    (tmp_path / "xerial-sqlite-jdbc-3.40.1.0.jar").write_bytes(b"")
    found = find_jdbc_jars([tmp_path])
    assert found.postgresql == (tmp_path / "postgresql-42.5.5.jar").resolve()
    assert found.sqlite == (tmp_path / "xerial-sqlite-jdbc-3.40.1.0.jar").resolve()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert find_jdbc_jars([empty]).paths() == []


@pytest.mark.parametrize("partitions", [1, 2, 3, 5, 16])
def test_key_range_predicates_cover_every_row_exactly_once(partitions: int) -> None:
    keys = [uuid.uuid4().hex for _ in range(300)] + ["", "N-", "zzz", "N-ff", "A", "0"]
    keys += [f"N-{uuid.uuid4().hex}.s0-{i}" for i in range(300)]
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE t (k TEXT)")
    connection.executemany("INSERT INTO t VALUES (?)", [(k,) for k in keys])
    for prefix in ("", "N-"):
        predicates = range_predicates("k", prefix, partitions, "sqlite")
        assert len(predicates) == partitions
        seen: list[str] = []
        for predicate in predicates:
            seen += [row[0] for row in connection.execute(f"SELECT k FROM t WHERE {predicate}")]
        assert sorted(seen) == sorted(keys)
    connection.close()


def test_a_missing_java_is_named_as_the_reason_to_skip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from persistence.analytics.spark import java_problem

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert java_problem() == "no Java runtime: neither $JAVA_HOME/bin/java nor java on PATH"


def test_key_range_predicates_cover_every_row_once_on_postgresql() -> None:
    engine = create_engine(normalize_url(database_for("postgresql")))
    keys = [uuid.uuid4().hex for _ in range(200)] + ["", "N-", "zzz", "N-ff", "A", "0", "é"]
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TEMP TABLE t (k text)"))
            connection.execute(text("INSERT INTO t VALUES (:k)"), [{"k": k} for k in keys])
            for partitions in (2, 5, 16):
                seen: list[str] = []
                for predicate in range_predicates("k", "", partitions, "postgresql"):
                    query = text(f"SELECT k FROM t WHERE {predicate}")
                    seen += list(connection.execute(query).scalars())
                assert sorted(seen) == sorted(keys)
    finally:
        engine.dispose()


def test_a_bad_node_fails_fast_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_node = tmp_path / "other.db"
    with sqlite3.connect(not_a_node) as connection:
        connection.execute("CREATE TABLE t (x)")
    connection.close()
    (tmp_path / "garbage.db").write_bytes(b"not a database at all" * 100)
    cases = {
        f"sqlite:///{tmp_path / 'missing.db'}": "no database file",
        f"sqlite:///{not_a_node}": "is not a fiberflow node database: no table node_checkpoints",
        f"sqlite:///{tmp_path / 'garbage.db'}": "cannot read",
        "mysql://x/y": "unsupported database",
        "alice.db": "must be a database URL or NAME=URL",
        "O=Bob,L=Paris,C=FR=postgresql://postgres@127.0.0.1:1/test": "cannot connect",
    }
    for node, message in cases.items():
        if "postgresql://" in node:  # the last case: it needs the driver (the others ran)
            require_service("the PostgreSQL driver", postgres_driver_problem())
        started = time.perf_counter()
        assert cli_main(["analyze", "--node", node, "--json", str(tmp_path / "r.json")]) == 2
        printed = capsys.readouterr()
        assert message in printed.err, (node, printed.err)
        assert "start Spark" not in printed.err and time.perf_counter() - started < 10
    assert not (tmp_path / "r.json").exists()


def test_text_tables_clip_long_cells_and_say_how_many_rows_are_left() -> None:
    table = Table(["node", "waited_ms", "since_ms"], [["x" * 60, 7_200_000, 1_800_000_000_000]], 3)
    printed = text_table(table, max_width=20)
    assert "x" * 19 + "…" in printed and "2h" in printed and "2027-01-15 08:00:00.000Z" in printed
    assert "2 more rows" in printed


# --- data -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> NetworkData:
    return build_clean_network(tmp_path_factory.mktemp("analytics-clean"))


@pytest.fixture(scope="module")
def broken(
    clean: NetworkData, tmp_path_factory: pytest.TempPathFactory
) -> tuple[NetworkData, Injected]:
    return corrupt(clean, tmp_path_factory.mktemp("analytics-broken"))


@pytest.fixture(scope="module")
def clean_cli(
    spark: Any, clean: NetworkData, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """``fiberflow analyze`` on the clean network: exit status, output, JSON and HTML."""
    require_jdbc()
    out = tmp_path_factory.mktemp("analytics-cli")
    argv = ["analyze", "--as-of", str(clean.now_ms + SETTINGS_MINUTE), "--grace", "30s"]
    for source in clean.sources((CHARLIE, DAVE)):
        argv += ["--node", source]
    for name in (ALICE, BOB):  # plain URLs: their names are found in the others' tables
        argv += ["--node", f"sqlite:///{clean.databases[name]}"]
    for name in NAMES:  # every node's key, also those named from the others' tables
        argv += ["--key-file", f"{name}={clean.keys[name]}"]
    argv += ["--json", str(out / "report.json"), "--html", str(out / "report.html")]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli_main(argv)
    return {
        "status": status,
        "stdout": stdout.getvalue(),
        "stderr": stderr.getvalue(),
        "json": json.loads((out / "report.json").read_text()),
        "html": (out / "report.html").read_text(),
    }


@pytest.fixture(scope="module")
def broken_report(spark: Any, broken: tuple[NetworkData, Injected]) -> AnalysisReport:
    require_jdbc()
    data, injected = broken
    sources = [parse_node_argument(s) for s in data.sources(injected.nodes)]
    return analyze(sources, settings_for(data), spark=spark)


# --- Spark: the clean network -----------------------------------------------------------------


@pytest.mark.spark
def test_the_responder_flow_id_in_spark_is_the_managers_uuid5(spark: Any) -> None:
    from pyspark.sql import functions as F

    pairs = [(ALICE, f"{uuid.uuid4().hex}.s{i}") for i in range(200)] + [("ü|x", "s.s0")]
    frame = spark.createDataFrame(pairs, "node string, session string")
    computed = frame.select(responder_flow_id(F.col("node"), F.col("session")).alias("id"))
    expected = [uuid.uuid5(RESPONDER_NAMESPACE, f"{n}|{s}").hex for n, s in pairs]
    assert [row["id"] for row in computed.collect()] == expected
    assert {flow_id[16] for flow_id in expected} == set("89ab")  # every variant digit seen


@pytest.mark.spark
def test_the_initiating_flow_is_found_in_tagged_and_untagged_session_ids(spark: Any) -> None:
    from pyspark.sql import functions as F

    flow, tag = uuid.uuid4().hex, "0123456789abcdef"
    sessions = [f"{flow}.s0", f"{flow}.s12.r", f"{tag}-{flow}.s3", f"{tag}-{flow}.s0.r"]
    frame = spark.createDataFrame([(s,) for s in sessions], "session string")
    found = frame.select(session_flow(F.col("session")).alias("flow")).collect()
    assert [row["flow"] for row in found] == [flow] * 4


def recorded_session_ids(data: NetworkData) -> list[tuple[str, str, str, int]]:
    """(node, our session id, message id, sequence) of every message a node consumed."""
    found = []
    for name, path in data.databases.items():
        with sqlite3.connect(path) as connection:
            found += [
                (name, session, message, sequence)
                for session, message, sequence in connection.execute(
                    "SELECT session_id, message_id, sequence FROM node_message_ids"
                )
            ]
        connection.close()
    return found


@pytest.mark.spark
def test_the_spark_session_id_expressions_agree_with_statemachine_session_ids(
    spark: Any, clean: NetworkData
) -> None:
    """Every expression of session_columns gives what its Python function gives.

    On the session ids the nodes of the clean network wrote (tagged: ``<tag>-F.s0``, both
    ends), and on the untagged ids of the same flows (``F.s0``, the older form).
    """
    from pyspark.sql import functions as F

    recorded = recorded_session_ids(clean)
    # every message id a node recorded is the grammar's id of the sender's session end
    assert recorded and all(
        message == message_id(peer_session_id(session), sequence)
        for _, session, message, sequence in recorded
    )
    tagged = sorted({(node, session) for node, session, _, _ in recorded})
    tags = {identity_tag(name) for name in NAMES}
    assert any(is_responder_session_id(s) for _, s in tagged)
    assert any(not is_responder_session_id(s) for _, s in tagged)
    assert all(s.split("-", 1)[0] in tags for _, s in tagged)
    flows = sorted({flow_id_of_session(s) for _, s in tagged})
    untagged = []  # the same flows' sessions in the older form, each seen on one node
    for index, flow in enumerate(flows):
        for number in (0, 12):
            opened = initiator_session_id(flow, number)
            name = NAMES[index % len(NAMES)]
            untagged += [(name, opened), (name, responder_session_id(opened))]
    ids = sorted({(node, session, sequence) for node, session, _, sequence in recorded})
    ids += [(node, session, sequence) for node, session in untagged for sequence in (0, 17, 12_345)]
    frame = spark.createDataFrame(ids, "node string, session string, sequence bigint")
    session, node, sequence = F.col("session"), F.col("node"), F.col("sequence")
    sent = expected_message_id(session, sequence)
    computed = frame.select(
        is_responder(session).alias("responder"),
        session_flow(session).alias("flow"),
        peer_session(session).alias("peer"),
        sent.alias("message"),
        message_session(sent).alias("back"),
        message_sequence(sent).alias("number"),
        responder_flow_id(node, initiator_session(session)).alias("responder_flow"),
        counterpart_flow(node, session).alias("counterpart"),
    ).collect()
    expected = []
    for name, sid, number in ids:
        initiator = peer_session_id(sid) if is_responder_session_id(sid) else sid
        responder = session_ids.responder_flow_id(name, initiator)
        expected.append(
            (
                is_responder_session_id(sid),
                flow_id_of_session(sid),
                peer_session_id(sid),
                message_id(sid, number),
                sid,
                number,
                responder,
                flow_id_of_session(sid) if is_responder_session_id(sid) else responder,
            )
        )
    assert [tuple(row) for row in computed] == expected


@pytest.mark.spark
def test_clean_network_passes_and_the_cli_exits_zero(
    clean_cli: dict[str, Any], clean: NetworkData
) -> None:
    assert clean_cli["status"] == 0, clean_cli["stdout"] + clean_cli["stderr"]
    report = clean_cli["json"]
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses == {
        "flow_counts": "info",
        "flows_over_time": "info",
        "stuck_flows": "ok",
        "session_consistency": "ok",
        "exactly_once_audit": "ok",
        "node_integrity": "ok",
        "session_ownership": "ok",
        "checkpoint_blobs": "ok",  # every node's blobs opened with its key
        "checkpoint_costs": "info",
        "failed_flows": "warn",  # the flow kept in the hospital
    }
    for check in (
        "stuck_flows",
        "session_consistency",
        "exactly_once_audit",
        "node_integrity",
        "session_ownership",
        "checkpoint_blobs",
    ):
        assert json_rows(report, check) == [], check
    (stuck,) = [c for c in report["checks"] if c["name"] == "stuck_flows"]
    assert [row[:2] for row in stuck["extras"]["paused"]["rows"]] == [list(clean.paused)]
    (consistency,) = [c for c in report["checks"] if c["name"] == "session_consistency"]
    outcomes = dict(consistency["extras"]["summary"]["rows"])
    assert outcomes["ok"] > 20 and outcomes["ok (refused)"] == 1  # UnansweredFlow's session
    assert set(outcomes) == {"ok", "ok (refused)"}
    assert all(node["path"] == "jdbc" for node in report["nodes"])
    named = {node["name"]: node["named_by"] for node in report["nodes"]}
    assert named == {
        CHARLIE: "argument",
        DAVE: "argument",
        ALICE: "other nodes",
        BOB: "other nodes",
    }
    assert f"is {ALICE} (named in the other nodes' tables)" in clean_cli["stdout"]
    assert "Verdicts" in clean_cli["stdout"] and "[OK  ] Cross-node session" in clean_cli["stdout"]
    assert "[4/10] cross-node session consistency" in clean_cli["stderr"]
    assert clean_cli["html"].count("<svg") == 3 and "fiberflow analysis" in clean_cli["html"]


def test_a_step_that_ends_with_the_jvm_gone_raises_its_own_error() -> None:
    """Putting the step property back fails when the JVM died: the step's error is raised."""
    from persistence.analytics.running import STEP_PROPERTY, spark_step

    class GoneContext:
        def __init__(self) -> None:
            self.properties: dict[str, str | None] = {STEP_PROPERTY: "load"}
            self.alive = True

        def getLocalProperty(self, key: str) -> str | None:
            return self.properties.get(key)

        def setLocalProperty(self, key: str, value: str | None) -> None:
            if not self.alive:
                raise ConnectionError("the JVM is gone")
            self.properties[key] = value

    context = GoneContext()
    spark: Any = type("Spark", (), {"sparkContext": context})()
    with spark_step(spark, "stuck_flows"):
        assert context.properties[STEP_PROPERTY] == "stuck_flows"
    assert context.properties[STEP_PROPERTY] == "load"  # the outer step's name is back
    with pytest.raises(RuntimeError, match="the check broke"), spark_step(spark, "stuck_flows"):
        context.alive = False
        raise RuntimeError("the check broke")
    assert context.properties[STEP_PROPERTY] == "stuck_flows"  # could not be put back
    context.alive, context.properties[STEP_PROPERTY] = True, "load"
    with pytest.raises(RuntimeError, match="the check broke"), spark_step(spark, "stuck_flows"):
        raise RuntimeError("the check broke")
    assert context.properties[STEP_PROPERTY] == "load"


@pytest.mark.spark
def test_each_check_runs_its_spark_jobs_under_its_step_name(
    spark: Any, clean: NetworkData, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs of a check carry its name (``fiberflow.analysis.step``), cleared after."""
    require_jdbc()
    from persistence.analytics import checks
    from persistence.analytics.check_results import INFO, CheckResult, Verdict
    from persistence.analytics.running import STEP_PROPERTY

    context = spark.sparkContext
    seen: list[str | None] = []

    def recording(snapshot: Any, settings: CheckSettings) -> CheckResult:
        seen.append(context.getLocalProperty(STEP_PROPERTY))
        frame = snapshot.checkpoints.select("node", "flow_id")
        return CheckResult("recording", "recording", frame, Verdict(INFO, "seen"))

    def failing(snapshot: Any, settings: CheckSettings) -> CheckResult:
        seen.append(context.getLocalProperty(STEP_PROPERTY))
        raise RuntimeError("the check broke")

    sources = [parse_node_argument(s) for s in clean.sources()]
    monkeypatch.setattr(checks, "CHECKS", (("recording", recording),))
    report = analyze(sources, settings_for(clean), spark=spark)
    assert [check.name for check in report.checks] == ["recording"]
    assert seen == ["recording"]
    assert context.getLocalProperty(STEP_PROPERTY) is None
    monkeypatch.setattr(checks, "CHECKS", (("failing", failing),))
    with pytest.raises(RuntimeError, match="the check broke"):
        analyze(sources, settings_for(clean), spark=spark)
    assert seen == ["recording", "failing"]
    assert context.getLocalProperty(STEP_PROPERTY) is None  # put back on the error too


@pytest.mark.spark
def test_flow_counts_match_the_databases(clean_cli: dict[str, Any], clean: NetworkData) -> None:
    expected: dict[tuple[str, str], int] = {}
    for name in NAMES:
        for status in [*clean.finished[name].values(), *clean.live[name].values()]:
            expected[(name, status)] = expected.get((name, status), 0) + 1
    counted: dict[tuple[str, str], int] = {}
    for row in json_rows(clean_cli["json"], "flow_counts"):
        key = (row["node"], row["status"])
        counted[key] = counted.get(key, 0) + row["flows"]
    assert counted == expected
    timeline = json_rows(clean_cli["json"], "flows_over_time")
    assert sum(row["flows"] for row in timeline) == sum(expected.values())
    assert {row["bucket_start_ms"] for row in timeline} == {clean.now_ms}  # 64-bit, not wrapped


@pytest.mark.spark
def test_failed_and_hospitalized_flows_are_listed_with_their_errors(
    clean_cli: dict[str, Any], clean: NetworkData
) -> None:
    found = {
        (r["node"], r["flow_class"].rsplit(".", 1)[1], r["outcome"], r["flows"])
        for r in json_rows(clean_cli["json"], "failed_flows")
    }
    assert found == {
        (ALICE, "BuyerFlow", "flow_exception", 1),
        (BOB, "SellerFlow", "flow_exception", 1),
        (ALICE, "FailingInitiator", "flow_exception", 1),
        (CHARLIE, "FailingResponder", "flow_exception", 1),
        (ALICE, "UnansweredFlow", "internal", 1),
        (CHARLIE, "LingeringFlow", "HOSPITALIZED", 1),
    }
    (failed,) = [c for c in clean_cli["json"]["checks"] if c["name"] == "failed_flows"]
    (kept,) = failed["extras"]["hospitalized"]["rows"]
    assert kept[1] == clean.hospitalized and kept[3] == "kept for observation by the test"


@pytest.mark.spark
def test_checkpoint_costs_rank_the_largest_checkpoints(
    clean_cli: dict[str, Any], clean: NetworkData
) -> None:
    sizes, journals = [], []
    for path in clean.databases.values():
        with sqlite3.connect(path) as connection:
            measured = connection.execute(
                "SELECT checkpoint_bytes, journal_length FROM node_checkpoints"
            ).fetchall()
        connection.close()
        sizes += [size for size, _ in measured]
        journals += [journal for _, journal in measured]
    (costs,) = [c for c in clean_cli["json"]["checks"] if c["name"] == "checkpoint_costs"]
    per_class = json_rows(clean_cli["json"], "checkpoint_costs")
    assert sum(r["flows"] for r in per_class) == len(sizes)
    assert max(r["max_bytes"] for r in per_class) == max(sizes)
    offenders = costs["extras"]["offenders"]
    by_size = [r[6] for r in offenders["rows"] if r[0] == "checkpoint_bytes"]
    assert by_size == sorted(sizes, reverse=True)[:10]
    # the longest journals, from the same scan of the checkpoints as the largest sizes
    by_journal = [r[7] for r in offenders["rows"] if r[0] == "journal_length"]
    assert by_journal == sorted(journals, reverse=True)[:10]
    assert [r[1] for r in offenders["rows"]] == [*range(1, 11), *range(1, 11)]
    histogram = costs["extras"]["size_histogram"]["rows"]
    assert sum(r[2] for r in histogram) == len(sizes)
    assert all(low <= size < high for low, high, _ in histogram for size in [low])


# --- Spark: the corrupted copy ----------------------------------------------------------------


@pytest.mark.spark
def test_a_deleted_counterpart_is_an_orphan_named_with_both_nodes(
    broken_report: AnalysisReport, broken: tuple[NetworkData, Injected]
) -> None:
    _, injected = broken
    found = [
        (r["node"], r["session_id"], r["counterparty"], r["counterpart_flow_id"])
        for r in rows(broken_report, "session_consistency")
    ]
    assert found == [injected.orphan]
    assert broken_report.check("session_consistency").status == "fail"
    assert broken_report.status == "fail"


@pytest.mark.spark
def test_the_exactly_once_audit_flags_exactly_what_was_injected(
    broken_report: AnalysisReport, broken: tuple[NetworkData, Injected]
) -> None:
    _, injected = broken
    found = rows(broken_report, "exactly_once_audit")
    kinds: dict[str, list[dict[str, Any]]] = {}
    for row in found:
        kinds.setdefault(row["kind"], []).append(row)
    assert set(kinds) == {"consumed_twice", "id_mismatch", "sequence_gap", "undelivered"}
    twice = sorted(
        (r["node"], r["session_id"], r["sequence"], r["message_ids"].split(" "))
        for r in kinds["consumed_twice"]
    )
    assert twice == injected.consumed_twice
    assert [(r["node"], r["message_ids"]) for r in kinds["id_mismatch"]] == [injected.id_mismatch]
    assert [(r["node"], r["session_id"], r["sequence"]) for r in kinds["sequence_gap"]] == [
        injected.gap
    ]
    (undelivered,) = kinds["undelivered"]
    assert (undelivered["node"], undelivered["message_ids"], undelivered["counterparty"]) == (
        injected.undelivered
    )
    assert "not consumed by" in undelivered["detail"]


@pytest.mark.spark
def test_a_flow_waiting_on_a_dead_node_is_stuck_and_a_paused_one_is_not(
    broken_report: AnalysisReport, broken: tuple[NetworkData, Injected]
) -> None:
    data, injected = broken
    (stuck,) = rows(broken_report, "stuck_flows")
    assert (stuck["node"], stuck["flow_id"], stuck["session_id"], stuck["counterparty"]) == (
        injected.stuck
    )
    assert stuck["counterpart_status"] == "not analyzed"
    assert stuck["counterparty_has_session"] is None
    assert stuck["waited_ms"] == 3 * 3_600_000 + SETTINGS_MINUTE
    assert broken_report.check("stuck_flows").status == "warn"
    # paused by an operator for as long, waiting on Dave too: on hold, listed, not stuck
    (held,) = rows(broken_report, "stuck_flows", "paused")
    assert (held["node"], held["flow_id"]) == data.paused
    assert held["paused_at"] == data.now_ms - 3 * 3_600_000
    assert "(1 paused by an operator, not judged)" in broken_report.check("stuck_flows").summary


@pytest.mark.spark
def test_the_arrow_fallback_finds_the_same_and_the_cli_exits_one(
    spark: Any,
    broken: tuple[NetworkData, Injected],
    broken_report: AnalysisReport,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data, injected = broken
    no_jars = tmp_path / "no-jars"
    no_jars.mkdir()
    argv = ["analyze", "--as-of", str(data.now_ms + SETTINGS_MINUTE), "--grace", "30s"]
    for source in data.sources(injected.nodes):
        argv += ["--node", source]
    argv += ["--jdbc-jars", str(no_jars), "--json", str(tmp_path / "r.json")]
    argv += ["--html", str(tmp_path / "r.html")]
    assert cli_main(argv) == 1
    printed = capsys.readouterr()
    assert "[FAIL] Cross-node session consistency" in printed.out
    report = json.loads((tmp_path / "r.json").read_text())
    assert [n["path"] for n in report["nodes"]] == ["arrow"] * 3
    assert all(f"no sqlite JDBC jar in {no_jars}" in n["detail"] for n in report["nodes"])
    for check in ("session_consistency", "exactly_once_audit", "stuck_flows", "flow_counts"):
        table = broken_report.check(check).table
        assert report_rows(report, check) == [list(r) for r in table.rows], check


def report_rows(report: dict[str, Any], check: str) -> list[list[Any]]:
    (found,) = [c for c in report["checks"] if c["name"] == check]
    return [list(row) for row in found["table"]["rows"]]


# --- Spark: PostgreSQL, one schema per node, read from one snapshot ---------------------------


@pytest.mark.spark
def test_postgresql_nodes_are_read_from_one_snapshot(spark: Any, tmp_path: Path) -> None:
    require_jdbc()
    url = database_for("postgresql")
    with MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=url) as network:
        alice, bob = network.create_node(ALICE), network.create_node(BOB)
        for _ in range(3):
            alice.start_flow(PingFlow(bob.party))
        lingering = alice.start_flow(LingeringFlow(bob.party)).flow_id
        network.run_network(advance_clock=False)
        now_ms = round(network.clock.now() * 1000)
        schemas = {m.name: m.config.database_schema for m in network.nodes}
        sources = [
            parse_node_argument(f"{name}={POSTGRES_URL}?schema={schema}")
            for name, schema in schemas.items()
        ]
        settings = CheckSettings(as_of_ms=now_ms + SETTINGS_MINUTE, grace_ms=30_000)
        engine = create_engine(normalize_url(POSTGRES_URL))

        def delete_the_initiator() -> None:  # after the snapshot: the reads must not see it
            with engine.begin() as connection:
                for table in ("node_checkpoints", "node_checkpoint_blobs"):
                    connection.execute(
                        text(f'DELETE FROM "{schemas[ALICE]}".{table} WHERE flow_id = :f'),
                        {"f": lingering},
                    )

        try:
            with load_nodes(
                spark, sources, rows_per_partition=2, on_snapshot=delete_the_initiator
            ) as snapshot:  # several JDBC partitions, each its own connection, one snapshot
                assert [n.path for n in snapshot.nodes] == ["jdbc", "jdbc"]
                assert all("partitions per table" in n.detail for n in snapshot.nodes)
                assert "one PostgreSQL REPEATABLE READ transaction" in snapshot.nodes[0].snapshot
                assert snapshot.spread_ms == 0
                live = {r["flow_id"] for r in snapshot.checkpoints.collect()}
                assert lingering in live
                assert session_consistency(snapshot, settings).verdict.status == "ok"
            for path in ("jdbc", "arrow"):  # Arrow: read inside the holding transaction
                with load_nodes(spark, sources, path=path) as snapshot:
                    assert [n.path for n in snapshot.nodes] == [path, path]
                    result = session_consistency(snapshot, settings)
                    orphans = [(r["node"], r["counterparty"]) for r in result.frame.collect()]
                    assert orphans == [(BOB, ALICE)], path
        finally:
            engine.dispose()


@pytest.mark.spark
def test_sqlite_is_read_from_a_backup_copy_not_the_live_file(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    require_jdbc()
    data = clean.copy_to(tmp_path / "live")
    first = data.lingering[0]

    def delete_the_initiator() -> None:
        with sqlite3.connect(data.databases[first.initiator_node]) as connection:
            connection.execute("DELETE FROM node_checkpoints WHERE flow_id = ?", (first.initiator,))
        connection.close()

    sources = [parse_node_argument(s) for s in data.sources((ALICE, BOB))]
    with load_nodes(spark, sources, on_snapshot=delete_the_initiator) as snapshot:
        assert "SQLite online backup" in snapshot.nodes[0].snapshot
        flows = {r["flow_id"] for r in snapshot.checkpoints.where(f"node = '{ALICE}'").collect()}
        assert first.initiator in flows
        stamps = snapshot.checkpoints.agg({"created_at": "min"}).first()
        assert stamps is not None and stamps[0] >= 1_800_000_000_000  # not wrapped at 32 bits


@pytest.mark.spark
def test_a_plain_url_no_other_node_names_keeps_its_url_as_name(
    spark: Any, clean: NetworkData
) -> None:
    require_jdbc()
    alone = parse_node_argument(f"sqlite:///{clean.databases[DAVE]}")
    with load_nodes(spark, [alone]) as snapshot:
        (node,) = snapshot.nodes
        assert (node.name, node.named_by) == (alone.name, "unknown")
        assert {r["node"] for r in snapshot.checkpoints.select("node").collect()} == {alone.name}


def test_html_report_escapes_what_the_tables_hold() -> None:
    from persistence.analytics.report import CheckReport

    table = Table(["node", "flow_class", "status", "flows"], [["<b>O=X</b>", "c", "FAILED", 1]], 1)
    check = CheckReport("flow_counts", "Flows", "info", "1 flow", 0, "", table, {}, 0.1)
    report = AnalysisReport(0, 0, "info", {}, [], 0, {"master": "m", "version": "v"}, 0.0, [check])
    page = render_html(report)
    assert "<b>O=X</b>" not in page and "&lt;b&gt;O=X&lt;/b&gt;" in page


def test_the_size_histogram_shows_the_empty_buckets_between_sizes() -> None:
    from persistence.analytics.report_html import histogram_chart, nice_ceiling

    chart = histogram_chart(
        Table(["from_bytes", "to_bytes", "flows"], [[512, 1024, 30], [4096, 8192, 2]], 2)
    )
    labels = re.findall(r">([^<>]+ to [^<>]+)</text>", chart)
    assert labels == ["512 B to 1 KiB", "1 KiB to 2 KiB", "2 KiB to 4 KiB", "4 KiB to 8 KiB"]
    assert chart.count("<rect") == 2 and "http" not in chart.replace('xmlns="http', "")
    assert [nice_ceiling(v) for v in (0, 3, 5, 9, 30, 41, 101, 999)] == [
        4,
        4,
        8,
        20,
        40,
        60,
        200,
        1000,
    ]
