"""The incremental Parquet export that ``fiberflow analyze --export-dir`` reads.

After a first export, a checkpoint row updated, one deleted, one inserted, one changed with
an old ``updated_at`` (a late commit) and a dedup id deleted must all be in the next export,
which must then hold exactly the database's rows; and analyzing the export must find what
analyzing the databases finds (the corrupted network of ``tests/analytics/test_analytics.py``).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from flows.cli.main import main as cli_main
from persistence.analytics import CheckSettings, analyze, parse_node_argument
from persistence.analytics.export import TIME_COLUMNS, export_nodes
from persistence.analytics.tables import TABLES
from persistence.store import NodeDatabase
from tests.analytics.test_analytics import broken, clean, require_jdbc
from tests.analytics_data import Injected, NetworkData, assert_same_findings

# module-scoped fixtures, shared with tests/analytics/test_analytics.py
__all__ = [
    "broken",
    "clean",
]

NAME = "O=Alice,L=London,C=GB"
T0 = 1_800_000_000_000
MINUTE = 60_000
CHECKPOINT = (
    "INSERT INTO node_checkpoints (flow_id, flow_class, status, progress_step, suspended_on,"
    " waiting_for, journal_length, checkpoint_bytes, error_message, created_at, updated_at,"
    " checkpoint_version) VALUES (?, 'app.Flow', ?, NULL, NULL, NULL, 3, 500, NULL, ?, ?, 1)"
)


def _node(path: Path, flows: int) -> list[str]:
    NodeDatabase(f"sqlite:///{path}").close()
    ids = [uuid.uuid4().hex for _ in range(flows)]
    with sqlite3.connect(path) as connection:
        connection.executemany(
            CHECKPOINT, [(flow, "RUNNABLE", T0, T0 + i * MINUTE) for i, flow in enumerate(ids)]
        )
        connection.executemany(
            "INSERT INTO node_checkpoint_blobs (flow_id, blob) VALUES (?, ?)",
            [(flow, b"") for flow in ids],
        )
        connection.executemany(
            "INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)",
            [
                (f"N-{flow}.s0-0", "O=Bob,L=Paris,C=FR", f"{flow}.s0", 0, T0 + i * MINUTE)
                for i, flow in enumerate(ids)
            ],
        )
    connection.close()
    return ids


def _database_rows(path: Path, frame: str) -> list[tuple[Any, ...]]:
    table, key, columns = TABLES[frame]
    with sqlite3.connect(path) as connection:
        found = connection.execute(
            f"SELECT {', '.join(n for n, _ in columns)} FROM {table} ORDER BY {key}"
        ).fetchall()
    connection.close()
    return found


def _exported_rows(folder: Path, frame: str) -> list[tuple[Any, ...]]:
    import pyarrow.parquet as pq

    _, key, columns = TABLES[frame]
    (file,) = folder.glob(f"*/{frame}.parquet")
    data = pq.read_table(file).sort_by(key)
    return [tuple(row[n] for n, _ in columns) for row in data.to_pylist()]


def test_an_updated_a_deleted_a_new_and_a_late_row_are_all_in_the_next_export(
    tmp_path: Path,
) -> None:
    path = tmp_path / "alice.db"
    ids = _node(path, 3000)
    folder = tmp_path / "export"
    source = parse_node_argument(f"{NAME}=sqlite:///{path}")
    (first,) = export_nodes([source], [f"{NAME}=sqlite:///{path}"], folder)
    assert first.full and first.tables["checkpoints"].rows == 3000
    for frame in TABLES:
        assert _exported_rows(folder, frame) == _database_rows(path, frame), frame
    updated, deleted, late, added = ids[10], ids[20], ids[30], uuid.uuid4().hex
    now = T0 + 3000 * MINUTE
    with sqlite3.connect(path) as connection:
        connection.execute(
            "UPDATE node_checkpoints SET status = 'SUSPENDED', suspended_on = 'Sleep', "
            "checkpoint_version = 2, updated_at = ? WHERE flow_id = ?",
            (now, updated),
        )
        connection.execute("DELETE FROM node_checkpoints WHERE flow_id = ?", (deleted,))
        connection.execute(CHECKPOINT, (added, "UNSTARTED", now, now))
        # a late commit: changed, but stamped long before the first export's watermark
        connection.execute(
            "UPDATE node_checkpoints SET status = 'HOSPITALIZED', error_message = 'late', "
            "checkpoint_version = 2 WHERE flow_id = ?",
            (late,),
        )
        connection.execute(
            "DELETE FROM node_message_ids WHERE message_id = ?", (f"N-{ids[40]}.s0-0",)
        )
        # a blob lost without its row (what node_integrity looks for): no time column tells
        connection.execute("DELETE FROM node_checkpoint_blobs WHERE flow_id = ?", (ids[50],))
    connection.close()
    (second,) = export_nodes([source], [f"{NAME}=sqlite:///{path}"], folder)
    assert not second.full
    for frame in TABLES:
        assert _exported_rows(folder, frame) == _database_rows(path, frame), frame
    exported = {row[0]: row for row in _exported_rows(folder, "checkpoints")}
    assert deleted not in exported and exported[added][2] == "UNSTARTED"
    assert exported[updated][2] == "SUSPENDED" and exported[late][2] == "HOSPITALIZED"
    checkpoints = second.tables["checkpoints"]
    # read again: the rows stamped within LATE_COMMIT_MS of the watermark (ten, with the
    # updated and the added one), and the buckets (of 1,048,576) of the deleted row and the late
    # commit, whose fingerprints changed
    assert checkpoints.rows == 3000 and checkpoints.changed == 12
    assert checkpoints.buckets == 2 and checkpoints.reread < 10
    assert second.tables["message_ids"].buckets == 1
    (file,) = folder.glob("*/checkpoints.parquet")
    written = file.stat().st_mtime_ns
    (third,) = export_nodes([source], [f"{NAME}=sqlite:///{path}"], folder)  # nothing changed
    assert third.tables["checkpoints"].buckets == 0
    assert file.stat().st_mtime_ns == written  # the rows read again were the same: not rewritten
    for frame in TABLES:
        assert _exported_rows(folder, frame) == _database_rows(path, frame), frame
    # the tables without a time column are exported whole on every refresh
    assert TABLES.keys() - TIME_COLUMNS.keys() == {"blobs", "workers"}
    assert ids[50] not in {row[0] for row in _exported_rows(folder, "blobs")}
    assert second.tables["blobs"].rows == second.tables["blobs"].changed == 2999


@pytest.mark.spark
@pytest.mark.parametrize(
    ("later_ms", "report_rows"),
    [(60_000, 200), (2 * 86_400_000, 2)],
    ids=["a-minute-on", "two-days-on-two-rows-kept"],
)
def test_analyzing_the_export_finds_what_analyzing_the_databases_finds(
    spark: Any,
    broken: tuple[NetworkData, Injected],
    tmp_path: Path,
    later_ms: int,
    report_rows: int,
) -> None:
    """Two days on most flows are stuck, and two rows kept: the first ones are ranked from
    the keys the export stored, and from keys computed from the databases' ids."""
    require_jdbc()
    data, injected = broken
    arguments = data.sources(injected.nodes)
    sources = [parse_node_argument(s) for s in arguments]
    settings = CheckSettings(
        as_of_ms=data.now_ms + later_ms, grace_ms=30_000, report_rows=report_rows
    )
    direct = analyze(sources, settings, spark=spark)
    export_nodes(sources, arguments, tmp_path / "export")
    exported = analyze(sources, settings, spark=spark, export_dir=tmp_path / "export")
    assert [n["path"] for n in exported.nodes] == ["export"] * len(sources)
    assert all(
        n["snapshot"].startswith("exported: SQLite read transaction") for n in exported.nodes
    )
    assert exported.status == direct.status == "fail"
    assert_same_findings(exported, direct)


def test_an_export_is_analyzed_as_it_is_with_no_refresh(
    spark: Any, broken: tuple[NetworkData, Injected], tmp_path: Path
) -> None:
    """``--no-refresh`` reads only the export: the databases may be gone, the export's time
    is what the report shows, and the findings are the export's."""
    data, injected = broken
    copies = tmp_path / "databases"
    copies.mkdir()
    arguments = []
    for name in injected.nodes:  # copies, removed before the analysis
        copy = copies / Path(data.databases[name]).name
        shutil.copyfile(data.databases[name], copy)
        arguments.append(f"{name}=sqlite:///{copy}")
    sources = [parse_node_argument(s) for s in arguments]
    export_nodes(sources, arguments, tmp_path / "export")
    settings = CheckSettings(as_of_ms=data.now_ms + 60_000, grace_ms=30_000)
    expected = analyze(sources, settings, spark=spark, export_dir=tmp_path / "export")
    shutil.rmtree(copies)
    argv = ["analyze", "--export-dir", str(tmp_path / "export"), "--no-refresh"]
    argv += ["--as-of", str(data.now_ms + 60_000), "--grace", "30s"]
    for argument in arguments:
        argv += ["--node", argument]
    argv += ["--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli_main(argv)
    assert status == 1, stderr.getvalue()
    assert "export 2" not in stderr.getvalue()  # nothing was refreshed
    report = json.loads((tmp_path / "r.json").read_text())
    assert [n["snapshot"] for n in report["nodes"]] == [n["snapshot"] for n in expected.nodes]
    assert all(n["snapshot"].startswith("exported: ") for n in report["nodes"])
    found = {c["name"]: (c["status"], c["summary"]) for c in report["checks"]}
    assert found == {c.name: (c.status, c.summary) for c in expected.checks}


def test_no_refresh_without_an_export_dir_is_refused(tmp_path: Path) -> None:
    """``--no-refresh`` alone, or with ``--export-only``, is a usage error (exit 2)."""
    node = f"A=sqlite:///{tmp_path / 'a.db'}"
    for extra in ([], ["--export-dir", str(tmp_path / "e"), "--export-only"]):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            status = cli_main(["analyze", "--no-refresh", *extra, "--node", node])
        assert status == 2
        assert "--no-refresh needs --export-dir, without --export-only" in stderr.getvalue()
