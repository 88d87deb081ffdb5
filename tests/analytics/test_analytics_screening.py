"""The conversation screening: the keys the export stores, the sequence check, and exactness.

The screening (persistence/analytics/screening.py) decides which conversations the checks'
full rules must judge; every other conversation it counts as healthy. So:

* the keys the export computes in Python must be those Spark computes (one ``xxhash64``, one
  responder id, one grammar), on the ids real nodes wrote and on malformed ones;
* the XOR-telescoping check of a session's sequence numbers must reject every multiset that
  is not exactly ``0..top`` once each;
* the screened checks must give exactly what the full rules give on the whole snapshot, on
  the clean and the corrupted networks and for each injected inconsistency.
"""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from persistence.analytics import (
    CheckSettings,
    find_jdbc_jars,
    flow_index,
    load_nodes,
    parse_node_argument,
    screening,
)
from persistence.analytics.candidates import candidate_snapshot
from persistence.analytics.checks.exactly_once_audit import audit_records, exactly_once_audit
from persistence.analytics.checks.session_consistency import judge_ends, session_consistency
from persistence.analytics.checks.session_ownership import judge_consumed, session_ownership
from persistence.analytics.screening import _gapless, screen
from persistence.analytics.session_flows import CONVERSATION, ODD, OWN, session_keys
from statemachine.session_ids import identity_tag, responder_flow_id
from tests.analytics_data import (
    ALICE,
    BOB,
    CHARLIE,
    NAMES,
    Injected,
    NetworkData,
    assert_same_findings,
    build_clean_network,
    corrupt,
    inject_blob_without_checkpoint,
    inject_checkpoint_without_blob,
    inject_finished_and_live,
    inject_misdirected_initiator_end,
    inject_misdirected_responder_end,
    inject_opening_recorded_twice,
    inject_reused_id,
    inject_unowned_initiator_end,
    inject_unowned_responder_end,
    sqlite_execute,
)
from tests.conftest import require_service

MINUTE_MS = 60_000


def require_jdbc() -> None:
    jars = find_jdbc_jars()
    missing = [d for d in ("sqlite", "postgresql") if jars.for_dialect(d) is None]
    require_service("JDBC drivers", f"no JDBC jar for {missing}" if missing else None)


@pytest.fixture(autouse=True)
def screen_every_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The networks here are small: screen them all the same (the path big snapshots take)."""
    monkeypatch.setattr(screening, "SCREEN_ABOVE_ROWS", 0)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> NetworkData:
    return build_clean_network(tmp_path_factory.mktemp("screening-clean"))


@pytest.fixture(scope="module")
def broken(
    clean: NetworkData, tmp_path_factory: pytest.TempPathFactory
) -> tuple[NetworkData, Injected]:
    return corrupt(clean, tmp_path_factory.mktemp("screening-broken"))


# --- the keys ---------------------------------------------------------------------------------


def session_rows(data: NetworkData) -> list[tuple[str, str, str | None, str | None]]:
    """(node, session, counterparty, waiting flow) of every wait and consumed message."""
    import json

    rows: list[tuple[str, str, str | None, str | None]] = []
    for name, path in data.databases.items():
        with sqlite3.connect(path) as connection:
            rows += [
                (name, session, sender, None)
                for session, sender in connection.execute(
                    "SELECT session_id, sender FROM node_message_ids"
                )
            ]
            for flow, text in connection.execute(
                "SELECT flow_id, waiting_for FROM node_checkpoints WHERE suspended_on = 'Receive'"
            ):
                rows += [(name, w["session"], w["counterparty"], flow) for w in json.loads(text)]
        connection.close()
    return rows


ODD_SESSIONS = [
    "not a session",
    "F.sx",
    "F.s1.r.r",
    ".s0",
    "0123456789abcdef-F.s2",
    "0123456789abcdeF-F.s2",
    "0123456789abcdef-.s2.r",
    "F.s0\n",
    "F\u2028.s0",
    "ünïcödé.s7.r",
]


@pytest.mark.spark
def test_the_session_keys_judge_the_grammar_and_the_tags(spark: Any, clean: NetworkData) -> None:
    """On the sessions the nodes wrote (tagged, both ends, waits and records) and odd ones."""
    from pyspark.sql import functions as F

    rows = session_rows(clean)
    assert len(rows) > 40
    flow = uuid.uuid4().hex
    rows += [(ALICE, session, BOB, flow) for session in ODD_SESSIONS]
    rows += [(BOB, session, ALICE, None) for session in ODD_SESSIONS]
    tagged = f"{identity_tag(BOB)}-{flow}.s0"  # Bob's tag on Alice's initiator session
    rows += [(ALICE, tagged, BOB, flow), (BOB, tagged, ALICE, flow), (ALICE, "F.s0", None, flow)]
    responder = responder_flow_id(ALICE, "G.s3")
    rows += [(BOB, "G.s3.r", ALICE, responder), (BOB, "G.s3.r", ALICE, flow)]
    frame = spark.createDataFrame(
        rows, "node string, session string, counterparty string, flow string"
    )
    keys = session_keys(
        F.col("node"),
        F.col("session"),
        F.col("counterparty"),
        named=list(NAMES),
        flow_id=F.col("flow"),
    )
    computed = frame.select(*[column.alias(name) for name, column in keys.items()]).collect()
    owned = {(r[0], r[1], r[3]): row[OWN] for r, row in zip(rows, computed, strict=True)}
    assert owned[(BOB, "G.s3.r", responder)] and not owned[(BOB, "G.s3.r", flow)]
    odd = {r[1]: row[ODD] for r, row in zip(rows, computed, strict=True) if r[0] == ALICE}
    assert all(odd[session] for session in ODD_SESSIONS[:6])  # not of the grammar, or tagged
    assert not odd["ünïcödé.s7.r"]
    assert odd[tagged]  # a session tagged for another node is left to the rules


@pytest.mark.spark
def test_a_records_oddity_is_its_id_and_sequence_number(spark: Any) -> None:
    """A consumed message is odd unless its id is ``N-<peer session>-<sequence>``."""
    from pyspark.sql import functions as F

    cases = [
        ("N-F.s0.r-0", "F.s0", 0),
        ("N-F.s0-3", "F.s0.r", 3),
        ("N-F.s0-3", "F.s0.r", 4),
        ("random", "F.s0.r", 0),
        ("N-F.s0--1", "F.s0.r", -1),
        (f"N-F.s0-{(1 << 63) - 1}", "F.s0.r", (1 << 63) - 1),
        ("N-F.s0-0", "F.s0.r", None),
    ]
    frame = spark.createDataFrame(cases, "message_id string, session string, sequence bigint")
    keys = session_keys(
        F.lit(ALICE),
        F.col("session"),
        F.lit(BOB),
        named=[],
        record=(F.col("message_id"), F.col("sequence")),
    )
    computed = [row[0] for row in frame.select(keys[ODD]).collect()]
    assert computed == [False, False, True, True, True, True, True]


# --- the sequence check -------------------------------------------------------------------------


@pytest.mark.spark
@examples(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.lists(st.integers(-1, 7), max_size=9), min_size=1, max_size=150))
def test_the_telescoping_xor_accepts_exactly_the_whole_sequences(
    spark: Any, sessions: list[list[int]]
) -> None:
    """``0..top`` once each passes; any gap, repeat or negative number does not."""
    from pyspark.sql import functions as F

    sessions = [*sessions, [], [0], [0, 1, 2], [0, 0], [1], [0, 2], [1, 5, 6, 2, 3, 7, 0, 4]]
    rows = [(index, number) for index, numbers in enumerate(sessions) for number in numbers]
    rows += [(index, None) for index, numbers in enumerate(sessions) if not numbers]
    frame = spark.createDataFrame(rows, "session int, sequence bigint")
    sequence = F.col("sequence")
    telescope = F.xxhash64(sequence).bitwiseXOR(F.xxhash64(sequence + 1))
    grouped = frame.groupBy("session").agg(
        F.count("sequence").alias("records"),
        F.max("sequence").alias("top"),
        F.bit_xor(telescope).alias("telescope"),
    )
    judged = dict(
        grouped.select("session", _gapless("records", "top", "telescope")).collect()  # type: ignore[arg-type]
    )
    for index, numbers in enumerate(sessions):
        assert judged[index] == (sorted(numbers) == list(range(len(numbers)))), numbers


# --- exactness ----------------------------------------------------------------------------------


def judged_both_ways(snapshot: Any, settings: CheckSettings) -> dict[str, Any]:
    """Each check screened, and its full rules on the whole snapshot: (rows, counts) each."""

    def rows(frame: Any) -> list[tuple[Any, ...]]:
        return sorted(tuple(row) for row in frame.collect())

    def counts(frame: Any) -> dict[str, int]:
        return {row[0]: row[1] for row in frame.collect()}

    screened_ends = session_consistency(snapshot, settings)
    orphans, outcomes = judge_ends(snapshot, settings)
    screened_consumed = session_ownership(snapshot, settings)
    owned, consumed = judge_consumed(snapshot)
    return {
        "consistency": (
            (rows(screened_ends.frame), counts(screened_ends.extras["summary"])),
            (rows(orphans), {k: v for k, v in outcomes.items() if v}),
        ),
        "ownership": (
            (rows(screened_consumed.frame), counts(screened_consumed.extras["summary"])),
            (rows(owned), {k: v for k, v in consumed.items() if v}),
        ),
        "audit": (
            rows(exactly_once_audit(snapshot, settings).frame),
            rows(audit_records(snapshot, settings).frame),
        ),
    }


def assert_screening_is_exact(
    spark: Any, data: NetworkData, names: tuple[str, ...], missing_flows: bool = False
) -> int:
    """The screened checks equal the full rules; returns the candidate conversations.

    ``missing_flows``: the data lost a flow other rows need, which the screening must see.
    """
    require_jdbc()
    settings = CheckSettings(as_of_ms=data.now_ms + MINUTE_MS, grace_ms=30_000)
    sources = [parse_node_argument(s) for s in data.sources(names)]
    with load_nodes(spark, sources) as snapshot:
        both = judged_both_ways(snapshot, settings)
        for check, (screened, full) in both.items():
            assert screened == full, check
        found = screen(snapshot, settings)
        if missing_flows:
            assert found.missing_flows >= 1
        restricted = candidate_snapshot(snapshot, settings)
        assert restricted.parent is snapshot and restricted.whole is snapshot
        assert found.conversations > found.candidate_count
        return found.candidate_count


@pytest.mark.spark
def test_the_screening_of_the_clean_network_is_exact(spark: Any, clean: NetworkData) -> None:
    """Most conversations are healthy; the refused and the in-flight ones are candidates."""
    assert assert_screening_is_exact(spark, clean, NAMES) >= 1


@pytest.mark.spark
@pytest.mark.parametrize("joined", [False, True], ids=["missing keys in a set", "joined"])
def test_the_screening_of_the_corrupted_network_is_exact(
    spark: Any, broken: tuple[NetworkData, Injected], monkeypatch: pytest.MonkeyPatch, joined: bool
) -> None:
    """Both ways of marking the conversations whose needed flows no table holds."""
    if joined:
        monkeypatch.setattr(screening, "MISSING_IN_DRIVER", 0)
    data, injected = broken
    assert assert_screening_is_exact(spark, data, injected.nodes, missing_flows=True) >= 4


@pytest.mark.spark
@pytest.mark.parametrize(
    "inject",
    [
        inject_unowned_responder_end,
        inject_unowned_initiator_end,
        inject_misdirected_responder_end,
        inject_misdirected_initiator_end,
    ],
)
def test_the_screening_is_exact_for_each_ownership_injection(
    spark: Any, clean: NetworkData, tmp_path: Any, inject: Any
) -> None:
    data = clean.copy_to(tmp_path)
    inject(sqlite_execute(data))
    assert_screening_is_exact(spark, data, NAMES)


@pytest.mark.spark
@pytest.mark.parametrize("refused", [False, True], ids=["held", "refused"])
def test_the_screening_is_exact_for_an_opening_message_consumed_by_two_nodes(
    spark: Any, clean: NetworkData, tmp_path: Any, refused: bool
) -> None:
    """The sender not analyzed: only the two consuming nodes tell the session apart."""
    data = clean.copy_to(tmp_path)
    inject_opening_recorded_twice(sqlite_execute(data), refused)
    assert_screening_is_exact(spark, data, (BOB, CHARLIE))


@pytest.mark.spark
def test_an_id_reused_from_a_healthy_conversation_is_found_and_screened_exactly(
    spark: Any, clean: NetworkData, tmp_path: Any
) -> None:
    """The record that reuses an id is a candidate; the one whose id it reuses is not."""
    from pyspark.sql import functions as F

    data = clean.copy_to(tmp_path)
    node, reused, echo_session = inject_reused_id(data)
    require_jdbc()
    settings = CheckSettings(as_of_ms=data.now_ms + MINUTE_MS, grace_ms=30_000)
    sources = [parse_node_argument(s) for s in data.sources(NAMES)]
    with load_nodes(spark, sources) as snapshot:
        for check, (screened, full) in judged_both_ways(snapshot, settings).items():
            assert screened == full, check
        found = screen(snapshot, settings)
        assert found.candidates is not None
        echo = found.candidates.where(F.col(CONVERSATION) == F.xxhash64(F.lit(echo_session)))
        assert echo.count() == 0  # the healthy side is only in the whole snapshot
        audit = exactly_once_audit(snapshot, settings).frame
        assert [
            (row["node"], row["message_ids"], row["detail"])
            for row in audit.where(F.col("kind") == "id_reused").collect()
        ] == [(node, reused, "id recorded for 2 messages")]
        mismatched = audit.where(F.col("kind") == "id_mismatch").collect()
        assert [(row["node"], row["message_ids"]) for row in mismatched] == [(node, reused)]


# --- the export's bucketed layout -------------------------------------------------------------


def exported_as_from_databases(
    spark: Any, data: NetworkData, names: tuple[str, ...], export_dir: Any
) -> tuple[list[Any], Any]:
    """Export ``names`` of ``data`` to ``export_dir`` and analyze both the export and the
    databases: the same findings. Returns the sources and the export's report."""
    from persistence.analytics import analyze
    from persistence.analytics.export import export_nodes

    require_jdbc()
    arguments = data.sources(names)
    sources = [parse_node_argument(s) for s in arguments]
    settings = CheckSettings(as_of_ms=data.now_ms + MINUTE_MS, grace_ms=30_000)
    export_nodes(sources, arguments, export_dir)
    direct = analyze(sources, settings, spark=spark)
    exported = analyze(sources, settings, spark=spark, export_dir=export_dir)
    assert_same_findings(exported, direct)
    return sources, exported


@pytest.mark.spark
@pytest.mark.parametrize("joined", [False, True], ids=["needed keys in a set", "joined"])
def test_the_export_layout_screens_as_the_tables_do_without_a_shuffle(
    spark: Any,
    broken: tuple[NetworkData, Injected],
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    joined: bool,
) -> None:
    """Screened from the export's bucketed datasets: the same findings as from the databases,
    and Spark groups the conversations without moving a row (no exchange below the grouping).
    Both ways of looking the needed flows up in the export's flows: the few as a set in one
    scan, and (more than ``MISSING_IN_DRIVER``) an anti-join."""
    if joined:
        monkeypatch.setattr(screening, "MISSING_IN_DRIVER", 0)
    from persistence.analytics.export_reading import load_export
    from persistence.analytics.screening import _conversations

    data, injected = broken
    sources, _ = exported_as_from_databases(spark, data, injected.nodes, tmp_path / "export")
    with load_export(spark, tmp_path / "export", sources) as snapshot:
        assert set(snapshot.layouts) == {"evidence", "flows"}
        plan = _conversations(snapshot, data.now_ms)._jdf.queryExecution().executedPlan().toString()
        assert "Exchange" not in plan, plan
        assert "Bucketed: true" in plan, plan


@pytest.mark.spark
def test_a_flow_of_which_only_the_blob_is_left_is_missing_to_the_export_layout(
    spark: Any, clean: NetworkData, tmp_path: Any
) -> None:
    """Alice's lingering initiator loses its checkpoint row (its blob stays): Bob's responder
    end has no counterpart, from the export's layout as from the databases (the layout's
    flows hold blob-only flows too, which the screening must not count as known)."""
    from persistence.analytics.export_reading import load_export

    data = clean.copy_to(tmp_path / "data")
    first = data.lingering[0]
    with sqlite3.connect(data.databases[first.initiator_node]) as db:
        db.execute("DELETE FROM node_checkpoints WHERE flow_id = ?", (first.initiator,))
    db.close()
    sources, exported = exported_as_from_databases(spark, data, NAMES, tmp_path / "export")
    settings = CheckSettings(as_of_ms=data.now_ms + MINUTE_MS, grace_ms=30_000)
    table = exported.check("session_consistency").table
    found = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
    assert (first.responder_node, f"{first.session}.r", first.initiator) in {
        (row["node"], row["session_id"], row["counterpart_flow_id"]) for row in found
    }, found
    with load_export(spark, tmp_path / "export", sources) as snapshot:
        assert set(snapshot.layouts) == {"evidence", "flows"}
        assert screen(snapshot, settings).missing_flows >= 1


def flow_totals(report: Any) -> dict[tuple[str, str, str], int]:
    """``flow_counts`` of a report: flows by (node, class, status)."""
    table = report.check("flow_counts").table
    rows = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
    return {(r["node"], r["flow_class"], r["status"]): int(r["flows"]) for r in rows}


@pytest.mark.spark
@pytest.mark.parametrize(
    "case", ["checkpoint_without_blob", "blob_without_checkpoint", "finished_and_live"]
)
def test_each_integrity_fault_is_found_from_the_export_as_from_the_databases(
    spark: Any, clean: NetworkData, tmp_path: Any, case: str
) -> None:
    """The path a large analysis takes: screened (the flow index's overlaps are what
    ``node_integrity`` and ``flow_counts`` use) and read from the export's layout. The
    injected fault is the one ``node_integrity`` finding, as from the databases; a flow
    finished and live counts once, as finished."""
    data = clean.copy_to(tmp_path / "data")
    execute = sqlite_execute(data)
    expected = {
        "checkpoint_without_blob": lambda: inject_checkpoint_without_blob(execute),
        "blob_without_checkpoint": lambda: inject_blob_without_checkpoint(execute),
        "finished_and_live": lambda: inject_finished_and_live(execute, data.now_ms),
    }[case]()
    _, exported = exported_as_from_databases(spark, data, NAMES, tmp_path / "export")
    integrity = exported.check("node_integrity")
    rows = [dict(zip(integrity.table.columns, row, strict=True)) for row in integrity.table.rows]
    assert [(r["node"], r["flow_id"], r["kind"]) for r in rows] == [
        (expected.node, expected.flow_id, expected.kind)
    ]
    assert integrity.status == "fail"
    if case == "finished_and_live":
        _, before = exported_as_from_databases(spark, clean, NAMES, tmp_path / "clean-export")
        counted, was = flow_totals(exported), flow_totals(before)
        key = (ALICE, "tests.analytics_data.LingeringFlow")
        assert counted[(*key, "SUSPENDED")] == was[(*key, "SUSPENDED")] - 1
        assert counted.get((*key, "COMPLETED"), 0) == was.get((*key, "COMPLETED"), 0) + 1
        assert sum(counted.values()) == sum(was.values())


@pytest.mark.spark
def test_the_export_layout_knows_most_ends_own_flows(
    spark: Any, clean: NetworkData, tmp_path: Any
) -> None:
    """An end whose own flow its node holds is marked so by the export (``SEEN_OWN_KNOWN``):
    the screening of the export looks up fewer flows than the screening of the tables, and
    none of the flows it still looks up is an end's own flow held by that end's node."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from persistence.analytics.export import export_nodes
    from persistence.analytics.export_reading import load_export
    from persistence.analytics.layout import FAILED, FINISHED, LIVE, SEEN_OWN_KNOWN

    require_jdbc()
    arguments = clean.sources(NAMES)
    sources = [parse_node_argument(s) for s in arguments]
    settings = CheckSettings(as_of_ms=clean.now_ms + MINUTE_MS, grace_ms=30_000)
    export_nodes(sources, arguments, tmp_path / "export")

    def wanted(snapshot: Any) -> set[int]:
        old_before = clean.now_ms + MINUTE_MS - settings.outbox_after_ms
        judged = screening._judged(screening._conversations(snapshot, old_before))
        judged = judged.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            return {row[0] for row in flow_index.wanted_keys(judged).collect()}
        finally:
            judged.unpersist()

    with load_nodes(spark, sources) as snapshot:
        from_tables = wanted(snapshot)
    with load_export(spark, tmp_path / "export", sources) as snapshot:
        from_export = wanted(snapshot)
        evidence = snapshot.layouts["evidence"]
        known = evidence.where(F.col("kinds").bitwiseAND(SEEN_OWN_KNOWN) != 0)
        own = F.when(F.col("responder"), F.col("responder_key")).otherwise(F.col("initiator_key"))
        known_keys = {row[0] for row in known.select(own).collect()}
        tables = F.col("tables").bitwiseAND(LIVE | FINISHED | FAILED)
        flows = snapshot.layouts["flows"].where(tables != 0)
        held = {row[0] for row in flows.select("flow_key").collect()}
    assert known_keys and known_keys <= held
    assert from_export < from_tables, (len(from_export), len(from_tables))
    assert not from_export & known_keys
