"""How the ``checkpoint_blobs`` facts reach Spark: in batches, as a frame of few partitions.

A regression guard for the 100,000-blob run that did not finish: streaming the blobs from a
SQLite snapshot yielded one row per chunk, so every blob became its own Arrow batch, and past
Spark's local-relation threshold every batch its own partition: each query of the check ran
stages of one task per blob. Real blobs of MockNetwork flows (tests/analytics_data.py's clean
network) are read here; the threshold is lowered so the small test data takes the path a large
run takes. The same streaming is checked where the loader's Arrow fallback and the PostgreSQL
export read rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows.cli.analyze_keys import NodeKey, load_keys
from persistence.analytics import load_nodes, parse_node_argument
from persistence.analytics.blob_facts import read_blob_facts, read_node_blobs
from persistence.analytics.opening import closer, open_sqlite
from tests.analytics_data import NAMES, NetworkData, build_clean_network

THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> NetworkData:
    return build_clean_network(tmp_path_factory.mktemp("blob-batches"))


@pytest.fixture
def no_local_relation(spark: Any) -> Iterator[None]:
    """Every Arrow ``createDataFrame`` takes the RDD path (one partition per batch sent)."""
    before = spark.conf.get(THRESHOLD)
    spark.conf.set(THRESHOLD, "0")
    try:
        yield
    finally:
        spark.conf.set(THRESHOLD, before)


def most_blobs(data: NetworkData) -> str:
    """The node with the most live checkpoints with sessions in ``data``."""
    import sqlite3

    def count(name: str) -> int:
        connection = sqlite3.connect(data.databases[name])
        try:
            ((n,),) = connection.execute(
                "SELECT COUNT(*) FROM node_checkpoints c JOIN node_checkpoint_blobs b "
                "USING (flow_id)"
            ).fetchall()
        finally:
            connection.close()
        return int(n)

    return max(NAMES, key=count)


def test_blobs_are_decoded_in_batches_not_one_by_one(
    clean: NetworkData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = most_blobs(clean)
    monkeypatch.setattr("persistence.analytics.blob_facts.BATCH_ROWS", 2)
    source = parse_node_argument(f"{name}=sqlite:///{clean.databases[name]}")
    opened = open_sqlite(source, tmp_path, 0)
    try:
        key = load_keys([NodeKey(name, clean.keys[name])])[name]
        problems, sessions, count = read_node_blobs(opened, source, name, key)
    finally:
        closer(opened.connection)()
    assert count >= 3, "the clean network should give a node several live checkpoints"
    assert not problems
    # Batches of BATCH_ROWS blobs: at most ceil(count / 2) of them, not one per blob.
    assert 1 <= len(sessions) <= math.ceil(count / 2)
    assert max(batch.num_rows for batch in sessions) > 1


def test_the_sessions_frame_has_one_partition_per_arrow_batch_of_rows(
    spark: Any, clean: NetworkData, no_local_relation: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches of one blob each (as the one-row chunks gave) still make a one-partition frame.
    monkeypatch.setattr("persistence.analytics.blob_facts.BATCH_ROWS", 1)
    sources = [parse_node_argument(s) for s in clean.sources(NAMES)]
    keys = load_keys([NodeKey(name, clean.keys[name]) for name in NAMES])
    with load_nodes(spark, sources) as snapshot:
        facts = read_blob_facts(snapshot, keys)
        rows = facts.sessions.count()
        partitions = facts.sessions.rdd.getNumPartitions()
        facts.sessions.unpersist()
        facts.problems.unpersist()
    assert sum(facts.blobs.values()) >= 3
    assert rows >= 3
    assert partitions == 1


def test_the_arrow_fallback_writes_row_groups_of_many_rows(
    spark: Any, clean: NetworkData, tmp_path: Path
) -> None:
    # The same streaming, in the loader's Arrow path (no JDBC driver): one row group of the
    # dedup ids, not one per row.
    import pyarrow.parquet as pq

    from persistence.analytics.reading import read_arrow

    name = most_blobs(clean)
    source = parse_node_argument(f"{name}=sqlite:///{clean.databases[name]}")
    opened = open_sqlite(source, tmp_path, 0)
    try:
        frame = read_arrow(spark, opened, source, "message_ids", tmp_path / "arrow")
        rows = frame.count()
    finally:
        closer(opened.connection)()
    metadata = pq.ParquetFile(tmp_path / "arrow" / "message_ids.parquet").metadata
    assert rows >= 2
    assert metadata.num_rows == rows
    assert metadata.num_row_groups == 1


def test_the_postgresql_export_reads_in_chunks_of_its_size() -> None:
    # On PostgreSQL ``partitions()`` without a size gives every row in one chunk.
    from sqlalchemy import create_engine

    from foundation.engine import normalize_url
    from persistence.analytics.export import _Reader
    from tests.conftest import POSTGRES_URL, postgres_problem, require_service

    require_service("PostgreSQL", postgres_problem())
    engine = create_engine(normalize_url(POSTGRES_URL))
    try:
        with engine.connect() as connection:
            reader = _Reader(None, connection)
            sql = "SELECT generate_series(1, ?)"
            chunks = [len(chunk) for chunk in reader.chunks(sql, (5,), size=2)]
            assert chunks == [2, 2, 1]
            assert reader.rows(sql, (5,)) == [(i,) for i in range(1, 6)]
    finally:
        engine.dispose()
