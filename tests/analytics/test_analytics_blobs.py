"""The ``checkpoint_blobs`` check: facts only the checkpoint blob holds, opened with the key.

Real flows on MockNetwork nodes (tests/analytics_data.py's clean network, whose nodes' keys
are written as key files), each fault injected alone on a copy of the clean databases: a
blob byte flipped (``mac_mismatch``), an older genuine blob under a newer row
(``stale_checkpoint``), a dedup row for a message the sender never sent
(``consumed_unsent``), the dedup id of the last message a live flow took in deleted
(``missing_last_dedup_id``). The clean copy gives nothing; without a key the verdict says
"not checked: no key". On PostgreSQL nodes a flipped blob, and each of the table-side
faults on copied schemas.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from flows.cli.analyze import add_analyze_arguments, run_analyze
from flows.cli.analyze_keys import NodeKey, load_keys, node_config_argument, parse_key_argument
from flows.cli.main import main as cli_main
from flows.testing import MockNetwork
from foundation.engine import normalize_url
from persistence.analytics import load_nodes, parse_node_argument, session_consistency
from persistence.analytics.check_results import CheckResult, CheckSettings
from persistence.analytics.checks.checkpoint_blobs import checkpoint_blobs
from persistence.analytics.sources import KeyArgumentError
from persistence.checkpoint_codec import decode_checkpoint, encode_checkpoint
from persistence.checkpoint_trust import CheckpointSeal
from samples.pingpong import PingFlow
from statemachine.immutable import replace
from statemachine.session_ids import responder_flow_id
from tests.analytics.test_analytics import require_jdbc, settings_for
from tests.analytics.test_analytics_integrity import (
    copies_dropped_after,
    copy_schemas,
    postgres_execute,
    postgres_sources,
)
from tests.analytics_blob_flows import ClosingFlow, NappingFlow
from tests.analytics_data import (
    ALICE,
    BOB,
    CHARLIE,
    CORDAPPS,
    NAMES,
    Execute,
    LingeringFlow,
    NetworkData,
    RefusalCaughtFlow,
    build_clean_network,
    two_node_network,
    write_key_file,
)
from tests.conftest import POSTGRES_URL, database_for

MINUTE_MS = 60_000


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> NetworkData:
    return build_clean_network(tmp_path_factory.mktemp("blobs-clean"))


@attrs.frozen
class Closing:
    """Alice's ClosingFlow, live, whose first conversation with Bob has finished."""

    data: NetworkData
    initiator: str
    session: str
    """Alice's first session (sent "one", "two" and its end: 3 messages)."""
    responder: str
    """Bob's finished responder of that session."""


@pytest.fixture(scope="module")
def closing(tmp_path_factory: pytest.TempPathFactory) -> Closing:
    directory = tmp_path_factory.mktemp("blobs-closing")
    # the minute between the two conversations
    data, initiator = two_node_network(directory, ClosingFlow, 61)
    now_ms, databases = data.now_ms, data.databases
    connection = sqlite3.connect(databases[BOB])
    ((session, responder),) = connection.execute(
        "SELECT m.session_id, r.flow_id FROM node_message_ids m, node_flow_results r "
        "WHERE m.sequence = 2 AND r.completed_at < ? GROUP BY m.session_id",
        (now_ms - 30_000,),
    ).fetchall()
    connection.close()
    return Closing(data, initiator, session.removesuffix(".r"), responder)


def blob_check(
    spark: Any,
    data: NetworkData,
    keyed: tuple[str, ...] = NAMES,
    settings: CheckSettings | None = None,
    names: tuple[str, ...] = NAMES,
) -> tuple[CheckResult, list[dict[str, Any]]]:
    """Run the check on ``data`` with the keys of ``keyed``: (result, findings as dicts)."""
    sources = [parse_node_argument(s) for s in data.sources(names)]
    keys = load_keys([NodeKey(name, data.keys[name]) for name in keyed])
    with load_nodes(spark, sources) as snapshot:
        snapshot.checkpoint_keys = keys
        result = checkpoint_blobs(snapshot, settings or settings_for(data))
        found = [row.asDict() for row in result.frame.collect()]
        if "sessions" in result.extras:  # collected while the snapshot is open
            frame = result.extras["sessions"]
            sessions = frame.collect()
            result.extras["sessions"] = snapshot.spark.createDataFrame(sessions, frame.schema)
    return result, found


def where(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(node, kind, flow, session, sequence) of each finding."""
    return [(r["node"], r["kind"], r["flow_id"], r["session_id"], r["sequence"]) for r in found]


def lingering_alice_to_bob(data: NetworkData) -> tuple[str, str, str]:
    """(Alice's initiator, its session, Bob's waiting responder) of a lingering conversation."""
    first = data.lingering[0]
    assert (first.initiator_node, first.responder_node) == (ALICE, BOB)
    return first.initiator, first.session, first.responder


# --- without Spark ----------------------------------------------------------------------------


def test_key_arguments_take_x500_names_and_load_the_nodes_mac_key(clean: NetworkData) -> None:
    key = parse_key_argument(f"{ALICE}={clean.keys[ALICE]}")
    assert key == NodeKey(ALICE, clean.keys[ALICE])
    assert parse_key_argument("O=Bob,L=Paris,C=FR=/keys/a=b.pem").path == Path("/keys/a=b.pem")
    with pytest.raises(KeyArgumentError, match="NODE=PATH"):
        parse_key_argument("/keys/alice.key.pem")
    mac_key = key.mac_key()  # the key the node sealed its blobs with: a blob opens
    connection = sqlite3.connect(clean.databases[ALICE])
    flow_id, version, blob, mac = connection.execute(
        "SELECT c.flow_id, c.checkpoint_version, b.blob, b.mac FROM node_checkpoints c "
        "JOIN node_checkpoint_blobs b USING (flow_id) LIMIT 1"
    ).fetchone()
    connection.close()
    checkpoint, problem = CheckpointSeal(mac_key).open(flow_id, version, blob, mac)
    assert problem is None and checkpoint is not None
    os.chmod(clean.keys[BOB], 0o644)
    try:
        with pytest.raises(KeyArgumentError, match="others may read"):
            load_keys([NodeKey(BOB, clean.keys[BOB])])
    finally:
        os.chmod(clean.keys[BOB], 0o600)
    with pytest.raises(KeyArgumentError, match="does not exist"):
        load_keys([NodeKey(BOB, clean.keys[BOB].with_name("none.pem"))])


def test_a_node_config_gives_the_node_and_its_key_file(tmp_path: Path) -> None:
    config = tmp_path / "alice.toml"
    config.write_text(
        f'name = "{ALICE}"\ndatabase_url = "sqlite:///alice.db"\n'
        'transport_url = "sqlite:///queue.db"\nkey_file = "keys/alice.key.pem"\n'
    )
    argument, key = node_config_argument(config)
    assert argument == f"{ALICE}=sqlite:///{tmp_path / 'alice.db'}"
    assert key == NodeKey(ALICE, tmp_path / "keys" / "alice.key.pem")


def test_a_bad_key_file_fails_fast_with_exit_2(tmp_path: Path) -> None:
    database = tmp_path / "alice.db"
    database.write_bytes(b"")
    err = io.StringIO()
    parser = argparse.ArgumentParser()
    add_analyze_arguments(parser)
    args = parser.parse_args(
        ["--node", f"{ALICE}=sqlite:///{database}", "--key-file", f"{ALICE}={tmp_path / 'no.pem'}"]
    )
    code = run_analyze(args, out=io.StringIO(), err=err)
    assert code == 2
    assert err.getvalue().startswith("fiberflow analyze: checkpoint key of O=Alice")
    assert "does not exist" in err.getvalue()
    err = io.StringIO()  # neither --node nor --node-config
    assert run_analyze(parser.parse_args([]), out=io.StringIO(), err=err) == 2
    assert err.getvalue() == "fiberflow analyze: give at least one --node (or --node-config)\n"


# --- Spark: the clean network -----------------------------------------------------------------


@pytest.mark.spark
def test_the_clean_network_gives_no_finding_with_every_key(spark: Any, clean: NetworkData) -> None:
    require_jdbc()
    result, found = blob_check(spark, clean)
    assert found == []
    assert result.verdict.status == "ok", result.verdict
    live = sum(len(flows) for flows in clean.live.values())
    assert result.verdict.summary.startswith(f"{live} blobs of ")
    sessions = {r["node"]: r["sessions"] for r in result.extras["sessions"].collect()}
    assert set(sessions) == set(NAMES) and all(n > 0 for n in sessions.values())


@pytest.mark.spark
def test_without_a_key_a_node_is_not_checked(spark: Any, clean: NetworkData) -> None:
    require_jdbc()
    result, found = blob_check(spark, clean, keyed=())
    assert found == []
    assert result.verdict.status == "info"
    assert result.verdict.summary.startswith("not checked: no key")
    assert all(name in result.verdict.summary for name in NAMES)
    result, found = blob_check(spark, clean, keyed=(ALICE, BOB))
    assert found == [] and result.verdict.status == "info"
    assert result.verdict.summary.endswith(f"not checked: no key for {CHARLIE}, O=Dave,L=Oslo,C=NO")


# --- Spark: one fault at a time ---------------------------------------------------------------


@pytest.mark.spark
def test_a_flipped_blob_byte_is_a_mac_mismatch(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    require_jdbc()
    data = clean.copy_to(tmp_path)
    initiator, _, _ = lingering_alice_to_bob(data)
    with sqlite3.connect(data.databases[ALICE]) as connection:
        (blob,) = connection.execute(
            "SELECT blob FROM node_checkpoint_blobs WHERE flow_id = ?", (initiator,)
        ).fetchone()
        flipped = bytearray(blob)
        flipped[len(flipped) // 2] ^= 0x01
        connection.execute(
            "UPDATE node_checkpoint_blobs SET blob = ? WHERE flow_id = ?",
            (bytes(flipped), initiator),
        )
    connection.close()
    result, found = blob_check(spark, data)
    assert [(r["node"], r["kind"], r["flow_id"]) for r in found] == [
        (ALICE, "mac_mismatch", initiator)
    ]
    assert found[0]["detail"].startswith("checkpoint MAC does not match")
    assert result.verdict.status == "fail"
    _, found = blob_check(spark, data, keyed=(BOB, CHARLIE))  # Alice's blobs not opened
    assert found == []


@pytest.mark.spark
def test_an_older_genuine_blob_put_back_is_stale(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    """The row says the node committed version v + 1; the blob is the genuine version v."""
    require_jdbc()
    data = clean.copy_to(tmp_path)
    _, _, responder = lingering_alice_to_bob(data)
    with sqlite3.connect(data.databases[BOB]) as connection:
        (version,) = connection.execute(
            "SELECT checkpoint_version FROM node_checkpoints WHERE flow_id = ?", (responder,)
        ).fetchone()
        connection.execute(
            "UPDATE node_checkpoints SET checkpoint_version = ? WHERE flow_id = ?",
            (version + 1, responder),
        )
    connection.close()
    _, found = blob_check(spark, data)
    assert [(r["node"], r["kind"], r["flow_id"]) for r in found] == [
        (BOB, "stale_checkpoint", responder)
    ]
    assert f"older genuine checkpoint (version {version}) was put back" in found[0]["detail"]


@pytest.mark.spark
def test_a_message_recorded_past_what_the_sender_sent_is_consumed_unsent(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    require_jdbc()
    data = clean.copy_to(tmp_path)
    initiator, session, responder = lingering_alice_to_bob(data)
    with sqlite3.connect(data.databases[ALICE]) as connection:
        (blob,) = connection.execute(
            "SELECT blob FROM node_checkpoint_blobs WHERE flow_id = ?", (initiator,)
        ).fetchone()
    connection.close()
    sent = decode_checkpoint(blob).session(session)
    assert sent is not None and sent.next_send_sequence == 1  # the hello
    ten_minutes_ago = data.now_ms - 10 * MINUTE_MS
    with sqlite3.connect(data.databases[BOB]) as connection:  # the goodbye, never sent
        connection.execute(
            "INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)",
            (f"N-{session}-1", ALICE, f"{session}.r", 1, ten_minutes_ago),
        )
    connection.close()
    result, found = blob_check(spark, data)
    assert [
        (r["node"], r["kind"], r["flow_id"], r["session_id"], r["sequence"]) for r in found
    ] == [(BOB, "consumed_unsent", initiator, f"{session}.r", 1)]
    assert found[0]["counterparty"] == ALICE
    assert "says it sent 1 on" in found[0]["detail"]
    assert result.verdict.status == "fail"
    # Without the sender's key there is no count: what remains is Bob's own rule, his
    # responder's checkpoint is behind a dedup id on its session (he would refuse it as stale)
    _, found = blob_check(spark, data, keyed=(BOB, CHARLIE))
    assert where(found) == [(BOB, "stale_checkpoint", responder, f"{session}.r", 1)]


def consistency_rows(spark: Any, data: NetworkData) -> list[tuple[str, str, str]]:
    """(node, session, outcome) of session consistency's listed ends."""
    sources = [parse_node_argument(s) for s in data.sources((ALICE, BOB))]
    with load_nodes(spark, sources) as snapshot:
        frame = session_consistency(snapshot, settings_for(data)).frame
        return [(r["node"], r["session_id"], r["outcome"]) for r in frame.collect()]


@pytest.mark.spark
def test_a_responder_lost_after_it_confirmed_is_found_from_the_initiators_blob(
    spark: Any, tmp_path: Path
) -> None:
    """Bob's waiting responder loses its checkpoint row and blob while Alice's flow, which
    took in his confirmation, sleeps without waiting on the session.

    Alice's blob says Bob's responder had confirmed the session, so with her key it is a
    finding, and without it none. Her checkpoint row's session facts say so too, so session
    consistency calls it an orphan (without them it looked the same as a refusal Alice caught:
    ``refused or lost``, a warning).
    """
    require_jdbc()
    data, initiator = two_node_network(tmp_path / "napping", NappingFlow, 2)
    result, found = blob_check(spark, data, keyed=(ALICE, BOB), names=(ALICE, BOB))
    assert found == [] and result.verdict.status == "ok", result.verdict
    assert consistency_rows(spark, data) == []
    with sqlite3.connect(data.databases[BOB]) as connection:
        ((responder, session),) = connection.execute(
            "SELECT flow_id, json_extract(waiting_for, '$[0].session') FROM node_checkpoints"
        ).fetchall()
        for table in ("node_checkpoints", "node_checkpoint_blobs"):
            connection.execute(f"DELETE FROM {table} WHERE flow_id = ?", (responder,))
    connection.close()
    session = session.removesuffix(".r")
    result, found = blob_check(spark, data, keyed=(ALICE, BOB), names=(ALICE, BOB))
    assert where(found) == [(ALICE, "responder_lost", initiator, session, 0)]
    assert found[0]["counterparty"] == BOB
    assert f"(its responder {responder} had started)" in found[0]["detail"]
    assert result.verdict.status == "fail"
    assert "1 responder_lost" in result.verdict.summary
    assert consistency_rows(spark, data) == [(ALICE, session, "orphan")]
    _, found = blob_check(spark, data, keyed=(BOB,), names=(ALICE, BOB))
    # without Alice's key her blob is not opened; Bob, keyed, has no live checkpoint left
    # (no blob to open is no finding, and no crash)
    assert found == []


@pytest.mark.spark
def test_a_refusal_the_initiator_caught_is_no_responder_lost(spark: Any, tmp_path: Path) -> None:
    """Bob has no responder: Alice's flow catches the refusal and sleeps; her blob says the
    session was never confirmed, so the blob check finds nothing (as her row's session facts
    say: ``ok (refused)``)."""
    require_jdbc()
    data, _ = two_node_network(tmp_path / "refusal", RefusalCaughtFlow, 2)
    result, found = blob_check(spark, data, keyed=(ALICE, BOB), names=(ALICE, BOB))
    assert found == []
    assert result.verdict.status == "ok", result.verdict
    sessions = {r["node"]: r["sessions"] for r in result.extras["sessions"].collect()}
    assert sessions == {ALICE: 1}  # the refused session is in her blob, unconfirmed
    assert [outcome for *_, outcome in consistency_rows(spark, data)] == []


@pytest.mark.spark
def test_a_deleted_last_dedup_id_is_found_from_the_receivers_checkpoint(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    """Bob's responder took in the hello (message 0); its dedup id is deleted."""
    require_jdbc()
    data = clean.copy_to(tmp_path)
    _, session, responder = lingering_alice_to_bob(data)
    with sqlite3.connect(data.databases[BOB]) as connection:
        deleted = connection.execute(
            "DELETE FROM node_message_ids WHERE session_id = ?", (f"{session}.r",)
        ).rowcount
    connection.close()
    assert deleted == 1
    _, found = blob_check(spark, data)
    assert [
        (r["node"], r["kind"], r["flow_id"], r["session_id"], r["sequence"]) for r in found
    ] == [(BOB, "missing_last_dedup_id", responder, f"{session}.r", 0)]
    assert found[0]["counterparty"] == ALICE


# --- Spark: PostgreSQL nodes and the command line ---------------------------------------------


@pytest.mark.spark
def test_postgresql_nodes_blobs_are_opened_and_a_flipped_one_found(
    spark: Any, tmp_path: Path
) -> None:
    require_jdbc()
    url = database_for("postgresql")
    with MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=url) as network:
        alice, bob = network.create_node(ALICE), network.create_node(BOB)
        keys = {m.name: write_key_file(m, tmp_path / "keys") for m in network.nodes}
        alice.start_flow(PingFlow(bob.party))
        lingering = alice.start_flow(LingeringFlow(bob.party)).flow_id
        network.run_network(advance_clock=False)
        now_ms = round(network.clock.now() * 1000)
        schemas = {m.name: m.config.database_schema for m in network.nodes}
        arguments = [f"{name}={POSTGRES_URL}?schema={schema}" for name, schema in schemas.items()]
        settings = CheckSettings(as_of_ms=now_ms + MINUTE_MS, grace_ms=30_000)
        mac_keys = load_keys([NodeKey(name, path) for name, path in keys.items()])

        def check() -> tuple[CheckResult, list[dict[str, Any]]]:
            sources = [parse_node_argument(a) for a in arguments]
            with load_nodes(spark, sources) as snapshot:
                snapshot.checkpoint_keys = mac_keys
                result = checkpoint_blobs(snapshot, settings)
                return result, [row.asDict() for row in result.frame.collect()]

        result, found = check()
        assert found == [] and result.verdict.status == "ok", result.verdict
        engine = create_engine(normalize_url(POSTGRES_URL))
        try:
            with engine.begin() as connection:
                table = f'"{schemas[ALICE]}".node_checkpoint_blobs'
                blob = connection.execute(
                    text(f"SELECT blob FROM {table} WHERE flow_id = :f"), {"f": lingering}
                ).scalar_one()
                flipped = bytearray(blob)
                flipped[-1] ^= 0x01
                connection.execute(
                    text(f"UPDATE {table} SET blob = :b WHERE flow_id = :f"),
                    {"b": bytes(flipped), "f": lingering},
                )
        finally:
            engine.dispose()
        result, found = check()
        assert [(r["node"], r["kind"], r["flow_id"]) for r in found] == [
            (ALICE, "mac_mismatch", lingering)
        ]


@pytest.mark.spark
def test_the_cli_takes_key_files_and_says_which_nodes_were_not_checked(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    require_jdbc()
    argv = ["analyze", "--as-of", str(clean.now_ms + MINUTE_MS), "--grace", "30s"]
    for source in clean.sources():
        argv += ["--node", source]
    for name in (ALICE, BOB, CHARLIE):
        argv += ["--key-file", f"{name}={clean.keys[name]}"]
    argv += ["--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(argv)
    assert code == 0, out.getvalue()
    (line,) = [x for x in out.getvalue().splitlines() if "no key for" in x]
    assert "no finding; not checked: no key for O=Dave,L=Oslo,C=NO" in line
    assert str(clean.keys[ALICE]) not in (tmp_path / "r.json").read_text()


# --- Spark: a finished conversation, by the sender's count ------------------------------------


def closing_check(spark: Any, data: NetworkData) -> tuple[CheckResult, list[dict[str, Any]]]:
    return blob_check(spark, data, keyed=(ALICE, BOB), names=(ALICE, BOB))


@pytest.mark.spark
def test_a_finished_conversation_is_clean_and_its_deleted_last_dedup_id_found(
    spark: Any, closing: Closing, tmp_path: Path
) -> None:
    """Alice sent 3 on the session (the end last); Bob's responder took all in and finished."""
    require_jdbc()
    result, found = closing_check(spark, closing.data)
    assert found == [] and result.verdict.status == "ok", result.verdict
    data = closing.data.copy_to(tmp_path / "deleted")
    with sqlite3.connect(data.databases[BOB]) as connection:
        deleted = connection.execute(
            "DELETE FROM node_message_ids WHERE session_id = ? AND sequence = 2",
            (f"{closing.session}.r",),
        ).rowcount
    connection.close()
    assert deleted == 1
    result, found = closing_check(spark, data)
    assert where(found) == [
        (BOB, "missing_last_dedup_id", closing.responder, f"{closing.session}.r", 2)
    ]
    assert found[0]["counterparty"] == ALICE
    assert "says it sent 3 on" in found[0]["detail"]
    assert result.verdict.status == "fail"


@pytest.mark.spark
def test_no_evidence_the_sender_heard_from_the_receiver_since_is_no_finding(
    spark: Any, closing: Closing, tmp_path: Path
) -> None:
    """The same deletion, but Alice's node took in nothing from Bob's after the responder
    finished (as if Alice's node were down): Bob's end could still be on its way."""
    require_jdbc()
    data = closing.data.copy_to(tmp_path / "unheard")
    with sqlite3.connect(data.databases[BOB]) as connection:
        connection.execute(
            "DELETE FROM node_message_ids WHERE session_id = ? AND sequence = 2",
            (f"{closing.session}.r",),
        )
        (ended,) = connection.execute(
            "SELECT completed_at FROM node_flow_results WHERE flow_id = ?", (closing.responder,)
        ).fetchone()
    connection.close()
    with sqlite3.connect(data.databases[ALICE]) as connection:
        connection.execute("UPDATE node_message_ids SET inserted_at = ?", (ended,))
    connection.close()
    _, found = closing_check(spark, data)
    assert found == []


@pytest.mark.spark
def test_an_older_blob_and_row_put_back_are_behind_their_dedup_ids(
    spark: Any, closing: Closing, tmp_path: Path
) -> None:
    """Alice's checkpoint as it was before it took in Bob's answer and end on the second
    session, row and blob together (sealed with her key, so the MAC matches the row)."""
    require_jdbc()
    data = closing.data.copy_to(tmp_path / "older")
    key = load_keys([NodeKey(ALICE, data.keys[ALICE])])[ALICE]
    with sqlite3.connect(data.databases[ALICE]) as connection:
        version, blob = connection.execute(
            "SELECT c.checkpoint_version, b.blob FROM node_checkpoints c "
            "JOIN node_checkpoint_blobs b USING (flow_id) WHERE flow_id = ?",
            (closing.initiator,),
        ).fetchone()
        checkpoint = decode_checkpoint(blob)
        (second,) = [s for s in checkpoint.sessions if s.session_id != closing.session]
        assert second.next_receive_sequence == 3  # Bob's confirm, "ok" and end
        older = replace(
            checkpoint,
            sessions=[
                closing_session
                for closing_session in checkpoint.sessions
                if closing_session.session_id == closing.session
            ]
            + [replace(second, next_receive_sequence=1, inbox=())],
            version=version - 1,
        )
        old_blob = encode_checkpoint(older)
        connection.execute(
            "UPDATE node_checkpoints SET checkpoint_version = ? WHERE flow_id = ?",
            (version - 1, closing.initiator),
        )
        connection.execute(
            "UPDATE node_checkpoint_blobs SET blob = ?, mac = ? WHERE flow_id = ?",
            (
                old_blob,
                CheckpointSeal(key).mac(closing.initiator, version - 1, old_blob),
                closing.initiator,
            ),
        )
    connection.close()
    _, found = closing_check(spark, data)
    assert where(found) == [(ALICE, "stale_checkpoint", closing.initiator, second.session_id, 1)]
    assert "expects message 1 next" in found[0]["detail"]


# --- Spark: the blob faults on PostgreSQL nodes, one at a time on copied schemas ----------------


@attrs.frozen
class PostgresBlobNetwork:
    """Alice and Bob on PostgreSQL schemas: a lingering conversation (Bob's responder waits)
    and a ClosingFlow whose first conversation has finished (Alice lives on)."""

    engine: Engine
    schemas: dict[str, str]
    keys: dict[str, Path]
    now_ms: int
    lingering: str
    """Alice's LingeringFlow (sent its hello, sleeps a day)."""


@pytest.fixture(scope="module")
def postgres_blob_network(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PostgresBlobNetwork]:
    url = database_for("postgresql")
    directory = tmp_path_factory.mktemp("blobs-postgres")
    cordapps = [*CORDAPPS, "tests.analytics_blob_flows"]
    with MockNetwork(cordapps=cordapps, directory=directory, database=url) as network:
        alice, bob = network.create_node(ALICE), network.create_node(BOB)
        keys = {m.name: write_key_file(m, directory / "keys") for m in network.nodes}
        alice.start_flow(PingFlow(bob.party))
        lingering = alice.start_flow(LingeringFlow(bob.party)).flow_id
        closing = alice.start_flow(ClosingFlow(bob.party))
        network.run_network(advance_clock=False)
        network.clock.advance(61)  # the minute between ClosingFlow's two conversations
        network.run_network(advance_clock=False)
        assert not closing.done()
        now_ms = round(network.clock.now() * 1000)
        schemas = {m.name: str(m.config.database_schema) for m in network.nodes}
        with copies_dropped_after(schemas) as engine:
            yield PostgresBlobNetwork(engine, schemas, keys, now_ms, lingering)


def lingering_conversation(execute: Execute) -> tuple[str, str]:
    """(the lingering session, Bob's waiting responder on it)."""
    (responder,) = execute(
        BOB,
        "SELECT flow_id FROM {t}node_checkpoints WHERE flow_class LIKE :c",
        {"c": "%.LingeringResponder"},
    )
    sessions = [
        str(session).removesuffix(".r")
        for (session,) in execute(BOB, "SELECT DISTINCT session_id FROM {t}node_message_ids", {})
    ]
    (session,) = [s for s in sessions if responder_flow_id(ALICE, s) == responder[0]]
    return session, str(responder[0])


BlobInjection = Callable[[Execute, PostgresBlobNetwork], tuple[Any, ...]]


def inject_consumed_unsent(execute: Execute, net: PostgresBlobNetwork) -> tuple[Any, ...]:
    """Bob records the goodbye of the lingering session, which Alice never sent."""
    session, _ = lingering_conversation(execute)
    execute(
        BOB,
        "INSERT INTO {t}node_message_ids (message_id, sender, session_id, sequence, "
        "inserted_at) VALUES (:m, :s, :r, 1, :at)",
        {"m": f"N-{session}-1", "s": ALICE, "r": f"{session}.r", "at": net.now_ms - MINUTE_MS},
    )
    return (BOB, "consumed_unsent", net.lingering, f"{session}.r", 1)


def inject_missing_live_dedup_id(execute: Execute, net: PostgresBlobNetwork) -> tuple[Any, ...]:
    """Bob's waiting responder took in the hello; its dedup id is deleted."""
    session, responder = lingering_conversation(execute)
    execute(BOB, "DELETE FROM {t}node_message_ids WHERE session_id = :r", {"r": f"{session}.r"})
    return (BOB, "missing_last_dedup_id", responder, f"{session}.r", 0)


def inject_missing_finished_dedup_id(execute: Execute, net: PostgresBlobNetwork) -> tuple[Any, ...]:
    """The dedup id of Alice's end of the finished conversation (message 2) is deleted."""
    ((session,),) = execute(
        BOB, "SELECT session_id FROM {t}node_message_ids WHERE sequence = 2", {}
    )
    execute(
        BOB,
        "DELETE FROM {t}node_message_ids WHERE session_id = :r AND sequence = 2",
        {"r": session},
    )
    responder = responder_flow_id(ALICE, str(session).removesuffix(".r"))
    return (BOB, "missing_last_dedup_id", responder, session, 2)


def inject_stale_checkpoint(execute: Execute, net: PostgresBlobNetwork) -> tuple[Any, ...]:
    """Bob's waiting responder's row says a version its (genuine, older) blob is not."""
    _, responder = lingering_conversation(execute)
    execute(
        BOB,
        "UPDATE {t}node_checkpoints SET checkpoint_version = checkpoint_version + 1 "
        "WHERE flow_id = :f",
        {"f": responder},
    )
    return (BOB, "stale_checkpoint", responder)


BLOB_INJECTIONS: dict[str, BlobInjection] = {
    "consumed_unsent": inject_consumed_unsent,
    "missing_live_dedup_id": inject_missing_live_dedup_id,
    "missing_finished_dedup_id": inject_missing_finished_dedup_id,
    "stale_checkpoint": inject_stale_checkpoint,
}


@pytest.mark.spark
def test_postgresql_nodes_blob_faults_are_each_found_alone(
    spark: Any, postgres_blob_network: PostgresBlobNetwork
) -> None:
    """The clean schemas give nothing; each fault on copied schemas gives exactly its finding."""
    require_jdbc()
    net = postgres_blob_network
    settings = CheckSettings(as_of_ms=net.now_ms + MINUTE_MS, grace_ms=30_000)
    mac_keys = load_keys([NodeKey(name, path) for name, path in net.keys.items()])

    def check(schemas: dict[str, str]) -> tuple[CheckResult, list[dict[str, Any]]]:
        with load_nodes(spark, postgres_sources(schemas)) as snapshot:
            snapshot.checkpoint_keys = mac_keys
            result = checkpoint_blobs(snapshot, settings)
            return result, [row.asDict() for row in result.frame.collect()]

    result, found = check(net.schemas)
    assert found == [] and result.verdict.status == "ok", result.verdict
    for index, case in enumerate(BLOB_INJECTIONS):
        copies = copy_schemas(net.engine, net.schemas, f"b{index}")
        expected = BLOB_INJECTIONS[case](postgres_execute(net.engine, copies), net)
        result, found = check(copies)
        assert [row[: len(expected)] for row in where(found)] == [expected], case
        assert result.verdict.status == "fail", case
