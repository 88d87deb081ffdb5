"""What opening checkpoint blobs costs the ``checkpoint_blobs`` check: blobs per second.

Runs real flows on a MockNetwork (a LingeringFlow: an initiator asleep after its first
message, its responder waiting for the second) to get genuine checkpoints, then writes
``--blobs`` copies of them (each its own flow id and session ids, sealed with the node's
key as the store seals them, with the dedup ids of the messages they took in) into a SQLite
node database of the real schema. It then times:

* ``decode``: :func:`persistence.analytics.blob_facts.read_node_blobs` alone, that is
  streaming the blobs from the snapshot copy, checking each MAC and decoding it in the driver
  (what the check adds per blob), in blobs per second;
* ``check``: the whole ``checkpoint_blobs`` check on Spark over the loaded snapshot (the
  decode, the facts into Spark, the joins with the dedup ids), then the stages and tasks
  Spark ran for the load and the check (a stage of a task per blob is the bug docs/analytics.md
  describes: it must stay a handful of tasks).

Run: ``python benchmarks/analytics_blobs.py [--blobs 100000] [--master local[*]]``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flows.testing import MockNetwork
from persistence.analytics import find_jdbc_jars, load_nodes, parse_node_argument, spark_session
from persistence.analytics.blob_facts import read_node_blobs
from persistence.analytics.check_results import CheckSettings
from persistence.analytics.checks.checkpoint_blobs import checkpoint_blobs
from persistence.analytics.opening import closer, open_sqlite
from persistence.analytics.spark import stop_spark
from persistence.checkpoint_codec import decode_checkpoint, encode_checkpoint
from persistence.checkpoint_trust import CheckpointSeal
from persistence.store import NodeDatabase
from statemachine.immutable import replace

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=Paris,C=FR"
FLOW_IN_SESSION = re.compile(r"[0-9a-f]{32}")
"""The initiating flow's id in a session id (each copy gets its own sessions)."""
TEMPLATE_FLOWS = 4
"""Lingering conversations run for templates (their checkpoints are copied round-robin)."""


def templates(directory: Path) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Alice's MAC key and her genuine checkpoint rows (flow class, blob)."""
    data = importlib.import_module("tests.analytics_data")  # test flows, not type-checked
    lingering = data.LingeringFlow
    with MockNetwork(cordapps=data.CORDAPPS, directory=directory) as network:
        alice, bob = network.create_node(ALICE), network.create_node(BOB)
        for _ in range(TEMPLATE_FLOWS):
            alice.start_flow(lingering(bob.party))
            bob.start_flow(lingering(alice.party))
        network.run_network(advance_clock=False)
        key = alice.identity.mac_key()
        path = alice.config.database_url.removeprefix("sqlite:///")
        connection = sqlite3.connect(path)
        rows = connection.execute(
            "SELECT c.flow_class, b.blob FROM node_checkpoints c "
            "JOIN node_checkpoint_blobs b USING (flow_id)"
        ).fetchall()
        connection.close()
    return key, rows


def write_database(path: Path, key: bytes, rows: list[tuple[str, bytes]], blobs: int) -> int:
    """``blobs`` copies of the template checkpoints, sealed, in a new node database; bytes."""
    NodeDatabase(f"sqlite:///{path}", synchronous="OFF").close()
    seal = CheckpointSeal(key)
    checkpoints = [(flow_class, decode_checkpoint(blob)) for flow_class, blob in rows]
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA synchronous=OFF")
    total = 0
    batch_rows: list[tuple[object, ...]] = []
    batch_blobs: list[tuple[object, ...]] = []
    batch_ids: list[tuple[object, ...]] = []  # the dedup ids of the messages taken in
    for index in range(blobs):
        flow_class, template = checkpoints[index % len(checkpoints)]
        flow_id = uuid.uuid4().hex
        sessions = [
            replace(
                session,
                session_id=FLOW_IN_SESSION.sub(flow_id, session.session_id),
                peer_session_id=FLOW_IN_SESSION.sub(flow_id, session.peer_session_id),
            )
            for session in template.sessions
        ]
        checkpoint = replace(template, flow_id=flow_id, sessions=sessions, version=1)
        blob = encode_checkpoint(checkpoint)
        total += len(blob)
        batch_rows.append((flow_id, flow_class, "SUSPENDED", 0, len(blob), 1, 1_800_000_000_000))
        batch_blobs.append((flow_id, blob, seal.mac(flow_id, 1, blob)))
        batch_ids.extend(
            (f"N-{session.peer_session_id}-{k}", session.counterparty, session.session_id, k, 0)
            for session in sessions
            for k in range(session.next_receive_sequence)
        )
        if len(batch_rows) == 10_000 or index == blobs - 1:
            connection.executemany(
                "INSERT INTO node_checkpoints (flow_id, flow_class, status, journal_length, "
                "checkpoint_bytes, checkpoint_version, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(*row, row[-1]) for row in batch_rows],
            )
            connection.executemany(
                "INSERT INTO node_checkpoint_blobs VALUES (?, ?, ?)", batch_blobs
            )
            connection.executemany("INSERT INTO node_message_ids VALUES (?, ?, ?, ?, ?)", batch_ids)
            connection.commit()
            batch_rows, batch_blobs, batch_ids = [], [], []
    connection.close()
    return total


def stage_tasks(spark: Any) -> list[int]:
    """The task count of every stage Spark ran so far (``statusTracker``; ``[0]`` for none)."""
    tracker = spark.sparkContext.statusTracker()
    tasks: list[int] = []
    for job in sorted(tracker.getJobIdsForGroup(None)):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info else []:
            stage_info = tracker.getStageInfo(stage)
            if stage_info is not None:
                tasks.append(stage_info.numTasks)
    return tasks or [0]


def main() -> None:
    """Generate, time the decode alone and the whole check, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blobs", type=int, default=100_000)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fiberflow-blobs-") as folder:
        directory = Path(folder)
        key, rows = templates(directory / "run")
        path = directory / "alice.db"
        started = time.perf_counter()
        size = write_database(path, key, rows, args.blobs)
        print(
            f"{args.blobs:,} blobs ({size / args.blobs:.0f} bytes each, {size / 2**20:.1f} MiB) "
            f"written in {time.perf_counter() - started:.1f} s; {os.cpu_count()} cores"
        )
        source = parse_node_argument(f"{ALICE}=sqlite:///{path}")
        opened = open_sqlite(source, directory, 0)
        try:
            started = time.perf_counter()
            _, sessions, count = read_node_blobs(opened, source, ALICE, key)
            seconds = time.perf_counter() - started
        finally:
            closer(opened.connection)()
        facts = sum(batch.num_rows for batch in sessions)
        print(
            f"decode: {count:,} blobs in {seconds:.1f} s = {count / seconds:,.0f} blobs/s "
            f"({facts:,} session facts)"
        )
        spark = spark_session(args.master, jars=find_jdbc_jars().paths())
        try:
            with load_nodes(spark, [source]) as snapshot:
                snapshot.checkpoint_keys = {ALICE: key}
                started = time.perf_counter()
                result = checkpoint_blobs(snapshot, CheckSettings(as_of_ms=1_800_000_060_000))
                result.frame.count()
                seconds = time.perf_counter() - started
            tasks = stage_tasks(spark)
            print(
                f"check: {seconds:.1f} s = {count / seconds:,.0f} blobs/s "
                f"({result.verdict.status}: {result.verdict.summary})"
            )
            print(f"spark: {len(tasks)} stages, {sum(tasks):,} tasks, the largest {max(tasks):,}")
        finally:
            stop_spark(spark)


if __name__ == "__main__":
    main()
