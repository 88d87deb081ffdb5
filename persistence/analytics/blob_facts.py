"""Reading the checkpoint blobs of a snapshot with the node's key: the facts only they hold.

A checkpoint blob is sealed with an HMAC under a key derived from the node's private key,
bound to its flow id and its version (:class:`~persistence.checkpoint_trust.CheckpointSeal`).
With that key, :func:`read_blob_facts` reads ``node_checkpoint_blobs`` beside each live
checkpoint row's ``checkpoint_version`` from the node's snapshot (the SQLite backup copy or
the held PostgreSQL transaction), opens every blob exactly as the node would when it loads
it, and keeps only small facts, per blob and per session:

* ``problems``: ``(node, flow_id, kind, detail)``, a blob the node would refuse to run
  (``mac_mismatch``, ``stale_checkpoint``, ``undecodable_checkpoint``,
  ``foreign_checkpoint``), with the reason :class:`CheckpointSeal` gives;
* ``sessions``: ``(node, flow_id, session_id, peer_session_id, counterparty,
  initiated_by_us, sent, received, early, closed_by_us, peer_finished, confirmed)``, one row
  per session of every trusted checkpoint: how many messages the flow sent on it
  (``next_send_sequence``) and took in (``next_receive_sequence``, plus the ``early`` ones
  taken in out of order), and whether the peer's responder confirmed it (``confirmed``: its
  first message, which a responder sends as it starts and a refusal never is, taken in).

Decoding is Python (msgpack and HMAC), so it runs in the driver, in batches of
:data:`BATCH_ROWS` rows streamed from the snapshot connection; the key never leaves this
process. The facts go to Spark as Arrow tables (a few dozen bytes per session, the blobs
themselves never reach Spark). ``benchmarks/analytics_blobs.py`` measures its cost (blobs per
second).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from sqlalchemy import text

from persistence.analytics.opening import OpenedDatabase, qualified_table
from persistence.analytics.sources import NodeSource
from persistence.checkpoint_trust import CheckpointSeal

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame

    from persistence.analytics.snapshot import Snapshot

BATCH_ROWS = 2_000
"""Blobs fetched and decoded per batch (bounded memory: a batch of blobs at a time)."""

PROBLEM_COLUMNS = ("node", "flow_id", "kind", "detail")
"""The columns of the problems frame."""

SESSION_COLUMNS = (
    ("node", "string"),
    ("flow_id", "string"),
    ("session_id", "string"),
    ("peer_session_id", "string"),
    ("counterparty", "string"),
    ("initiated_by_us", "bool"),
    ("sent", "int64"),
    ("received", "int64"),
    ("early", "list<int64>"),
    ("closed_by_us", "bool"),
    ("peer_finished", "bool"),
    ("confirmed", "bool"),
)
"""The columns of the sessions frame and their Arrow types."""


def problem_kind(reason: str) -> str:
    """The finding kind of a reason :meth:`CheckpointSeal.open` gives for an untrusted blob."""
    if reason.startswith("stale checkpoint"):
        return "stale_checkpoint"
    if reason.startswith("checkpoint MAC does not match"):
        return "mac_mismatch"
    if reason.startswith("undecodable checkpoint"):
        return "undecodable_checkpoint"
    return "foreign_checkpoint"


@attrs.frozen
class BlobFacts:
    """What the blobs of the keyed nodes say, as Spark frames, and what reading them cost."""

    problems: DataFrame
    """``(node, flow_id, kind, detail)``: blobs a node would refuse."""
    sessions: DataFrame
    """One row per session of every trusted checkpoint (see the module docstring)."""
    blobs: dict[str, int]
    """Node name to the blobs read and opened."""
    seconds: float
    """Wall time of reading and decoding them all."""


def decode_rows(
    node: str, rows: Iterable[tuple[str, int, bytes, bytes | None]], seal: CheckpointSeal
) -> tuple[list[tuple[str, str, str, str]], dict[str, list[Any]]]:
    """Open ``(flow_id, version, blob, mac)`` rows: (problems, session columns)."""
    problems: list[tuple[str, str, str, str]] = []
    columns: dict[str, list[Any]] = {name: [] for name, _ in SESSION_COLUMNS}
    for flow_id, version, blob, mac in rows:
        checkpoint, reason = seal.open(flow_id, int(version), bytes(blob), _bytes(mac))
        if checkpoint is None:
            assert reason is not None
            problems.append((node, flow_id, problem_kind(reason), reason))
            continue
        for session in checkpoint.sessions:
            columns["node"].append(node)
            columns["flow_id"].append(flow_id)
            columns["session_id"].append(session.session_id)
            columns["peer_session_id"].append(session.peer_session_id)
            columns["counterparty"].append(session.counterparty)
            columns["initiated_by_us"].append(session.initiated_by_us)
            columns["sent"].append(session.next_send_sequence)
            columns["received"].append(session.next_receive_sequence)
            columns["early"].append([early.sequence for early in session.early])
            columns["closed_by_us"].append(session.closed_by_us)
            columns["peer_finished"].append(session.peer_finished())
            columns["confirmed"].append(session.confirmed)
    return problems, columns


def _bytes(value: bytes | memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


def _session_schema() -> pyarrow.Schema:
    import pyarrow as pa

    types = {
        "string": pa.string(),
        "bool": pa.bool_(),
        "int64": pa.int64(),
        "list<int64>": pa.list_(pa.int64()),
    }
    return pa.schema([(name, types[kind]) for name, kind in SESSION_COLUMNS])


def _problem_schema() -> pyarrow.Schema:
    import pyarrow as pa

    return pa.schema([(name, pa.string()) for name in PROBLEM_COLUMNS])


def read_node_blobs(
    opened: OpenedDatabase, source: NodeSource, node: str, key: bytes
) -> tuple[list[pyarrow.RecordBatch], list[pyarrow.RecordBatch], int]:
    """Stream and open one node's blobs: (problem batches, session batches, blobs read).

    Only blobs of live checkpoint rows are read (a blob without its row, or a row without
    its blob, is the integrity check's finding, not this one's), with the row's
    ``checkpoint_version``, which the MAC binds.
    """
    import pyarrow as pa

    seal = CheckpointSeal(key)
    query = text(
        "SELECT c.flow_id, c.checkpoint_version, b.blob, b.mac "
        f"FROM {qualified_table(source, 'node_checkpoints')} c "
        f"JOIN {qualified_table(source, 'node_checkpoint_blobs')} b ON b.flow_id = c.flow_id"
    )
    result = opened.connection.execution_options(stream_results=True, yield_per=BATCH_ROWS).execute(
        query
    )
    problem_schema, session_schema = _problem_schema(), _session_schema()
    problem_batches: list[pyarrow.RecordBatch] = []
    session_batches: list[pyarrow.RecordBatch] = []
    count = 0
    # The size must be given here: on SQLite, ``partitions()`` without one yields one-row
    # chunks despite ``yield_per`` (SQLAlchemy 2.1), that is one Arrow batch per blob.
    for chunk in result.partitions(BATCH_ROWS):
        count += len(chunk)
        problems, columns = decode_rows(node, (tuple(row) for row in chunk), seal)
        if problems:
            values = list(zip(*problems, strict=True))
            problem_batches.append(
                pa.RecordBatch.from_arrays(
                    [pa.array(v, pa.string()) for v in values], schema=problem_schema
                )
            )
        if columns["node"]:
            arrays = [pa.array(columns[field.name], type=field.type) for field in session_schema]
            session_batches.append(pa.RecordBatch.from_arrays(arrays, schema=session_schema))
    return problem_batches, session_batches, count


def read_blob_facts(snapshot: Snapshot, keys: Mapping[str, bytes]) -> BlobFacts:
    """Open the blobs of every node in ``keys`` at the snapshot, into Spark frames."""
    import pyarrow as pa

    started = time.perf_counter()
    problem_batches: list[pyarrow.RecordBatch] = []
    session_batches: list[pyarrow.RecordBatch] = []
    blobs: dict[str, int] = {}
    for node, key in keys.items():
        opened, source = snapshot.databases[node]
        problems, sessions, count = read_node_blobs(opened, source, node, key)
        problem_batches += problems
        session_batches += sessions
        blobs[node] = count
    spark = snapshot.spark
    problems_frame = _frame(spark, pa.Table.from_batches(problem_batches, _problem_schema()))
    sessions_frame = _frame(spark, pa.Table.from_batches(session_batches, _session_schema()))
    return BlobFacts(
        problems=problems_frame,
        sessions=sessions_frame,
        blobs=blobs,
        seconds=time.perf_counter() - started,
    )


def _frame(spark: Any, table: pyarrow.Table) -> DataFrame:
    """An Arrow table as a cached Spark frame (an empty one keeps its schema).

    ``createDataFrame`` sends the table's record batches as they are (split only above
    ``spark.sql.execution.arrow.maxRecordsPerBatch``) and, once they exceed
    ``spark.sql.execution.arrow.localRelationThreshold`` (48 MiB), makes one partition of
    each: batches of a few rows would become a stage of one task per batch in every query
    that reads the frame. The chunks are merged first, so the frame has one partition per
    ``maxRecordsPerBatch`` rows at most (a local relation below the threshold).
    """
    # no batch at all (a keyed node with no live checkpoint): a table of no chunks, which
    # createDataFrame refuses ("cannot construct ChunkedArray from empty vector"); the
    # schema's own empty table has one empty chunk per column
    table = table.combine_chunks() if table.num_rows else table.schema.empty_table()
    frame: DataFrame = spark.createDataFrame(table)
    return frame.cache()
