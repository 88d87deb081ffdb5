"""What the checks find once both ends of a conversation have finished: the session facts.

Every checkpoint, result and exception row keeps the facts of its flow's sessions (sent,
received, confirmed: ``session_facts``). Three kinds of damage were invisible to the checks
once the checkpoint blobs were gone; each is injected here alone on real MockNetwork flows
and must be found exactly, screened as by the full rules, and from the Parquet export as from
the databases:

* a dedup id recorded for a message its (finished) sender never sent: ``consumed_unsent``;
* the last dedup id a (finished) flow took in deleted: ``missing_last_dedup_id``, and every
  dedup id of a finished conversation deleted (nothing left of it but the facts);
* a responder's rows deleted while its initiator, which took in its confirmation, sleeps:
  an ``orphan`` in session consistency (the tables alone said ``refused or lost``) and its
  end ``unowned`` in session ownership (the tables alone said ``refused``); the same
  responder lost once its initiator ended (the tables alone said ``ok (refused)``); and a
  refusal the initiator caught is ``ok (refused)`` and ``refused`` (the tables alone said
  ``refused or lost``).

Also: Spark and Python parse the facts alike (on what nodes write, and on damaged text).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from persistence.analytics import CheckSettings, find_jdbc_jars, load_nodes, parse_node_argument
from persistence.analytics import screening as screening_module
from persistence.analytics.checks.exactly_once_audit import audit_records, exactly_once_audit
from persistence.analytics.checks.session_consistency import judge_ends, session_consistency
from persistence.analytics.checks.session_ownership import judge_consumed, session_ownership
from persistence.analytics.export import export_nodes
from persistence.analytics.export_reading import load_export
from persistence.analytics.flow_facts import FACTS_TEXT, python_facts, with_facts
from persistence.analytics.screening import screen
from tests.analytics_blob_flows import HelloFlow, NappingFlow
from tests.analytics_data import (
    ALICE,
    BOB,
    NAMES,
    NetworkData,
    RefusalCaughtFlow,
    build_clean_network,
    two_node_network,
)
from tests.conftest import require_service

MINUTE_MS = 60_000


def require_jdbc() -> None:
    jars = find_jdbc_jars()
    missing = [d for d in ("sqlite", "postgresql") if jars.for_dialect(d) is None]
    require_service("JDBC drivers", f"no JDBC jar for {missing}" if missing else None)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> NetworkData:
    return build_clean_network(tmp_path_factory.mktemp("facts-clean"))


def settings_for(data: NetworkData) -> CheckSettings:
    return CheckSettings(as_of_ms=data.now_ms + MINUTE_MS, grace_ms=30_000)


def facts_of(path: Path, table: str, flow_id: str) -> list[dict[str, Any]]:
    """The session facts of ``flow_id``'s row in ``table`` of the database at ``path``."""
    with sqlite3.connect(path) as connection:
        (text,) = connection.execute(
            f"SELECT {FACTS_TEXT} FROM {table} WHERE flow_id = ?", (flow_id,)
        ).fetchone()
    connection.close()
    facts: list[dict[str, Any]] = json.loads(text)
    return facts


def finished_ping(data: NetworkData, which: int = 0) -> tuple[str, str]:
    """(Alice's ``which``-th finished PingFlow to Bob, its session)."""
    with sqlite3.connect(data.databases[ALICE]) as connection:
        flow_id, text = connection.execute(
            f"SELECT flow_id, {FACTS_TEXT} FROM node_flow_results "
            "WHERE flow_class LIKE '%.PingFlow' ORDER BY flow_id LIMIT 1 OFFSET ?",
            (which,),
        ).fetchone()
    connection.close()
    ((fact,),) = [json.loads(text)]
    return flow_id, fact["session"]


def records(path: Path, session: str) -> list[int]:
    """The sequence numbers of ``session`` recorded in the database at ``path``."""
    with sqlite3.connect(path) as connection:
        found = [
            row[0]
            for row in connection.execute(
                "SELECT sequence FROM node_message_ids WHERE session_id = ? ORDER BY sequence",
                (session,),
            )
        ]
    connection.close()
    return found


def audit_rows(spark: Any, data: NetworkData, screened: bool = False) -> list[dict[str, Any]]:
    """The audit's findings on ``data`` (every node), screened and by the full rules alike."""
    sources = [parse_node_argument(s) for s in data.sources(NAMES)]
    settings = settings_for(data)
    with load_nodes(spark, sources) as snapshot:
        rows = [row.asDict() for row in exactly_once_audit(snapshot, settings).frame.collect()]
        if screened:
            assert screen(snapshot, settings).candidates is not None
            full = [row.asDict() for row in audit_records(snapshot, settings).frame.collect()]
            assert sorted(map(str, rows)) == sorted(map(str, full))
    return rows


def where(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["node"], r["kind"], r["session_id"], r["sequence"]) for r in rows]


@pytest.fixture(params=[False, True], ids=["whole", "screened"])
def screened(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Judged whole (a small snapshot), or screened as a big one is."""
    if request.param:
        monkeypatch.setattr(screening_module, "SCREEN_ABOVE_ROWS", 0)
    return bool(request.param)


# --- a record of a message never sent -------------------------------------------------------


@pytest.mark.spark
def test_a_record_of_a_message_its_finished_sender_never_sent_is_consumed_unsent(
    spark: Any, clean: NetworkData, tmp_path: Path, screened: bool
) -> None:
    """Both flows of a ping/pong have finished; Bob gets a record of one message more than
    Alice's PingFlow says it sent on the session (its blob is long gone)."""
    require_jdbc()
    data = clean.copy_to(tmp_path)
    ping, session = finished_ping(data)
    ((fact,),) = [facts_of(data.databases[ALICE], "node_flow_results", ping)]
    sent = fact["sent"]
    assert records(data.databases[BOB], f"{session}.r") == list(range(sent))  # all taken in
    with sqlite3.connect(data.databases[BOB]) as bob:
        bob.execute(
            "INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)",
            (f"N-{session}-{sent}", ALICE, f"{session}.r", sent, data.now_ms - 10 * MINUTE_MS),
        )
    bob.close()
    found = audit_rows(spark, data, screened)
    assert where(found) == [(BOB, "consumed_unsent", f"{session}.r", sent)]
    assert found[0]["counterparty"] == ALICE
    assert f"its sender's flow {ping} says it sent {sent} on {session}" in found[0]["detail"]
    # without the facts (a row written before they were kept) nothing tells: no finding
    with sqlite3.connect(data.databases[ALICE]) as alice:
        alice.execute(
            f"UPDATE node_flow_results SET {FACTS_TEXT} = NULL WHERE flow_id = ?", (ping,)
        )
    alice.close()
    assert audit_rows(spark, data, screened) == []


# --- a last dedup id lost ---------------------------------------------------------------------


@pytest.mark.spark
def test_the_last_dedup_id_a_finished_flow_took_in_lost_is_missing_last_dedup_id(
    spark: Any, clean: NetworkData, tmp_path: Path, screened: bool
) -> None:
    """Bob's echo responder has finished, and so has Alice's initiator; the dedup id of the
    last message Bob took in is deleted (no gap is left below a later one)."""
    require_jdbc()
    data = clean.copy_to(tmp_path)
    session = f"{data.echo_session}.r"
    taken = records(data.databases[BOB], session)
    last = taken[-1]
    with sqlite3.connect(data.databases[BOB]) as bob:
        (responder,) = bob.execute(
            "SELECT flow_id FROM node_flow_results WHERE flow_class LIKE '%.EchoResponder'"
        ).fetchone()
        bob.execute(
            "DELETE FROM node_message_ids WHERE session_id = ? AND sequence = ?", (session, last)
        )
    bob.close()
    ((fact,),) = [facts_of(data.databases[BOB], "node_flow_results", responder)]
    assert fact["received"] == last + 1
    found = audit_rows(spark, data, screened)
    assert where(found) == [(BOB, "missing_last_dedup_id", session, last)]
    assert found[0]["message_ids"] == f"N-{data.echo_session}-{last}"
    assert found[0]["counterparty"] == ALICE
    assert f"taken in by flow {responder} (it says it took in {last + 1})" in found[0]["detail"]


@pytest.mark.spark
def test_a_finished_conversation_whose_every_dedup_id_was_lost_is_found_from_its_facts(
    spark: Any, clean: NetworkData, tmp_path: Path, screened: bool
) -> None:
    """Nothing of a finished ping/pong is left in the tables but its two flows' rows: each
    message either flow took in is missing (the screening finds it from the facts alone)."""
    require_jdbc()
    data = clean.copy_to(tmp_path)
    _, session = finished_ping(data)
    alice_took, bob_took = (
        records(data.databases[ALICE], session),
        records(data.databases[BOB], f"{session}.r"),
    )
    assert alice_took and bob_took
    for node, end in ((ALICE, session), (BOB, f"{session}.r")):
        with sqlite3.connect(data.databases[node]) as connection:
            connection.execute("DELETE FROM node_message_ids WHERE session_id = ?", (end,))
        connection.close()
    found = audit_rows(spark, data, screened)
    expected = [(ALICE, "missing_last_dedup_id", session, k) for k in alice_took]
    expected += [(BOB, "missing_last_dedup_id", f"{session}.r", k) for k in bob_took]
    assert sorted(where(found)) == sorted(expected)
    assert all(row["counterparty"] is None for row in found)  # no record names the peer


# --- a responder lost after it confirmed ------------------------------------------------------


def consistency_rows(
    spark: Any, data: NetworkData, screened: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """Session consistency's listed ends, and session ownership's findings and counts
    (screened: the same as by the full rules)."""
    sources = [parse_node_argument(s) for s in data.sources((ALICE, BOB))]
    settings = settings_for(data)
    with load_nodes(spark, sources) as snapshot:
        rows = [row.asDict() for row in session_consistency(snapshot, settings).frame.collect()]
        owned = session_ownership(snapshot, settings)
        found = [row.asDict() for row in owned.frame.collect()]
        counts = {row[0]: row[1] for row in owned.extras["summary"].collect()}
        if screened:
            full, _ = judge_ends(snapshot, settings)
            assert sorted(map(str, rows)) == sorted(map(str, (r.asDict() for r in full.collect())))
            consumed, _ = judge_consumed(snapshot)
            assert sorted(map(str, found)) == sorted(
                map(str, (r.asDict() for r in consumed.collect()))
            )
    return rows, found, counts


@pytest.mark.spark
def test_a_responder_lost_after_it_confirmed_is_an_orphan_while_its_initiator_sleeps(
    spark: Any, tmp_path: Path, screened: bool
) -> None:
    """Bob's waiting responder loses its checkpoint row and blob; Alice's NappingFlow, which
    took in his confirmation, sleeps without waiting on the session. Her row's facts say the
    session was confirmed: the responder ran and is gone, no refusal."""
    require_jdbc()
    data, initiator = two_node_network(tmp_path / "napping", NappingFlow)
    assert consistency_rows(spark, data, screened)[:2] == ([], [])
    ((fact,),) = [facts_of(data.databases[ALICE], "node_checkpoints", initiator)]
    assert fact["confirmed"] and fact["received"] == 1
    with sqlite3.connect(data.databases[BOB]) as connection:
        (responder,) = connection.execute("SELECT flow_id FROM node_checkpoints").fetchone()
        for table in ("node_checkpoints", "node_checkpoint_blobs"):
            connection.execute(f"DELETE FROM {table} WHERE flow_id = ?", (responder,))
    connection.close()
    (row,), (unowned,), _ = consistency_rows(spark, data, screened)
    assert (row["node"], row["session_id"], row["outcome"]) == (ALICE, fact["session"], "orphan")
    assert (row["counterparty"], row["counterpart_flow_id"]) == (BOB, responder)
    assert "which confirmed the session" in row["problem"]
    # Bob's end, its opening message consumed and no flow held: no refusal either
    assert (unowned["node"], unowned["session_id"], unowned["kind"]) == (
        BOB,
        f"{fact['session']}.r",
        "unowned",
    )
    assert unowned["flow_id"] == responder
    assert "the initiating flow's row says it confirmed the session" in unowned["reason"]


@pytest.mark.spark
def test_a_responder_lost_after_its_initiator_ended_having_its_confirmation_is_an_orphan(
    spark: Any, tmp_path: Path, screened: bool
) -> None:
    """Alice's HelloFlow ended with one message taken in, Bob's confirmation (what a refusal
    would leave); Bob's finished responder's result row is deleted. Her result row's facts
    say the session was confirmed: an orphan, not ``ok (refused)``."""
    require_jdbc()
    data, initiator = two_node_network(tmp_path / "hello", HelloFlow, lives_on=False)
    ((fact,),) = [facts_of(data.databases[ALICE], "node_flow_results", initiator)]
    assert fact["confirmed"] and fact["received"] == 1
    assert consistency_rows(spark, data, screened)[:2] == ([], [])
    with sqlite3.connect(data.databases[BOB]) as connection:
        (responder,) = connection.execute("SELECT flow_id FROM node_flow_results").fetchone()
        connection.execute("DELETE FROM node_flow_results WHERE flow_id = ?", (responder,))
    connection.close()
    (row,), (unowned,), _ = consistency_rows(spark, data, screened)
    assert (row["node"], row["session_id"], row["outcome"]) == (ALICE, fact["session"], "orphan")
    assert row["counterpart_flow_id"] == responder
    assert "which confirmed the session" in row["problem"]
    assert (unowned["node"], unowned["kind"]) == (BOB, "unowned")  # it took in hello and end
    # without the facts (a row written before they were kept) it looked like a refusal
    with sqlite3.connect(data.databases[ALICE]) as alice:
        alice.execute(f"UPDATE node_flow_results SET {FACTS_TEXT} = NULL")
    alice.close()
    assert consistency_rows(spark, data, screened)[0] == []  # ok (refused): not listed


@pytest.mark.spark
def test_a_refusal_the_initiator_caught_is_a_refusal_by_its_facts(
    spark: Any, tmp_path: Path, screened: bool
) -> None:
    """Bob has no responder: Alice's flow catches the refusal and sleeps. Her facts say the
    session was never confirmed: ``ok (refused)``, not listed. Without the facts (a row
    written before they were kept) the tables cannot tell: ``refused or lost``, a warning."""
    require_jdbc()
    data, initiator = two_node_network(tmp_path / "refusal", RefusalCaughtFlow)
    ((fact,),) = [facts_of(data.databases[ALICE], "node_checkpoints", initiator)]
    assert not fact["confirmed"] and fact["received"] == 1
    rows, owned, counts = consistency_rows(spark, data, screened)
    assert rows == []  # ok (refused): not listed
    assert owned == [] and counts.get("refused") == 1  # Bob's end: a refusal, not judged
    with sqlite3.connect(data.databases[ALICE]) as alice:
        alice.execute(f"UPDATE node_checkpoints SET {FACTS_TEXT} = NULL")
    alice.close()
    (row,), owned, counts = consistency_rows(spark, data, screened)
    assert (row["node"], row["outcome"]) == (ALICE, "refused or lost")
    assert "a refusal it caught, or a responder that confirmed" in row["problem"]
    assert owned == [] and counts.get("refused") == 1


# --- the export -------------------------------------------------------------------------------


@pytest.mark.spark
def test_the_export_carries_the_facts_and_finds_the_same(
    spark: Any, clean: NetworkData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The damage above at once (a record never sent, a last dedup id lost, every dedup id
    of another conversation lost), analyzed from the databases and from the export's
    bucketed layout (screened): the same findings."""
    require_jdbc()
    monkeypatch.setattr(screening_module, "SCREEN_ABOVE_ROWS", 0)
    data = clean.copy_to(tmp_path / "copy")
    ping, session = finished_ping(data)
    ((fact,),) = [facts_of(data.databases[ALICE], "node_flow_results", ping)]
    echo = f"{data.echo_session}.r"
    last = records(data.databases[BOB], echo)[-1]
    with sqlite3.connect(data.databases[BOB]) as bob:
        bob.execute(
            "INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)",
            (
                f"N-{session}-{fact['sent']}",
                ALICE,
                f"{session}.r",
                fact["sent"],
                data.now_ms - 10 * MINUTE_MS,
            ),
        )
        bob.execute(
            "DELETE FROM node_message_ids WHERE session_id = ? AND sequence = ?", (echo, last)
        )
    bob.close()
    _, other = finished_ping(data, 1)
    for node, end in ((ALICE, other), (BOB, f"{other}.r")):
        with sqlite3.connect(data.databases[node]) as connection:
            connection.execute("DELETE FROM node_message_ids WHERE session_id = ?", (end,))
        connection.close()
    sources = [parse_node_argument(s) for s in data.sources(NAMES)]
    settings = settings_for(data)

    def judged(snapshot: Any) -> tuple[list[str], list[str]]:
        audit = exactly_once_audit(snapshot, settings).frame.collect()
        ends = session_consistency(snapshot, settings).frame.collect()
        return sorted(map(str, audit)), sorted(map(str, ends))

    with load_nodes(spark, sources) as snapshot:
        from_databases = judged(snapshot)
    folder = tmp_path / "export"
    export_nodes(sources, data.sources(NAMES), folder)
    with load_export(spark, folder, sources) as snapshot:
        assert snapshot.layouts  # the bucketed layout, with the facts summed up per end
        from_export = judged(snapshot)
    assert from_export == from_databases
    assert any("consumed_unsent" in row for row in from_databases[0])
    assert sum(f"session_id='{echo}'" in row for row in from_databases[0]) == 1
    assert any(f"session_id='{other}.r', sequence=0" in row for row in from_databases[0])


# --- parsing ----------------------------------------------------------------------------------

TEXTS = [
    '[{"session":"T-F.s0","sent":3,"received":2,"confirmed":true}]',
    '[{"session":"T-F.s0.r","sent":0,"received":1,"confirmed":false},'
    '{"session":"\\u00e9\\"x","sent":12,"received":0,"confirmed":true}]',
    "[]",
    None,
    "",
    "null",
    "garbage",
    '{"session":"a","sent":1,"received":2,"confirmed":true}',  # not a list
    '[{"session":"a","sent":1,"received":2,"confirmed":true}] trailing',
    '[{"session":"a","sent":"1","received":2,"confirmed":true}]',
    '[{"session":"a","sent":1.5,"received":2,"confirmed":true}]',
    '[{"session":"a","sent":99999999999999999999,"received":2,"confirmed":true}]',
    '[{"session":"a","sent":-1,"received":2,"confirmed":true}]',
    '[{"session":"a","sent":1,"received":2}]',
    '[{"session":1,"sent":1,"received":2,"confirmed":true}]',
    '[1, {"session":"b","sent":1,"received":2,"confirmed":false}]',
    '[{"session":"a","sent":1,"received":2,"confirmed":true}]\n',
    '[{"session":"a\nb","sent":1,"received":2,"confirmed":true}]',
    '[{"session":"a", "sent":1,"received":2,"confirmed":true}]',
]


@pytest.mark.spark
def test_spark_and_python_parse_the_facts_alike(spark: Any) -> None:
    """What a node writes is parsed; anything else (a damaged row) gives no facts, both ways."""
    frame = spark.createDataFrame([(text,) for text in TEXTS], f"{FACTS_TEXT} string")
    parsed = [
        None if row[0] is None else [fact.asDict() for fact in row[0]]
        for row in with_facts(frame).select("facts").collect()
    ]
    assert parsed == [python_facts(text) for text in TEXTS]
    assert [facts is not None for facts in parsed] == [True] * 3 + [False] * (len(TEXTS) - 3)
