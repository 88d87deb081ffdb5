"""The session ends and flows of each node, and the export's copy of them, bucketed by key.

The conversation screening (:mod:`persistence.analytics.screening`) groups every row that
shows a session end by its conversation, and every flow by its key. :func:`evidence_rows`
gives those rows (a session a flow waits on, a consumed message, an outbox message, a session
in a flow's facts) with their keys (:mod:`persistence.analytics.session_flows`), and
:func:`session_ends` sums them up per session end (:data:`EVIDENCE_SCHEMA`).

Grouping tens of millions of rows means moving each of them through a shuffle (most of the
screening's time), so an analysis of a Parquet export writes, per named node and once per
refresh, two datasets beside its tables, as Spark's bucketed tables keep them:
:data:`EVIDENCE` (the node's session ends, bucketed by conversation) and :data:`FLOWS` (one
row per flow key with the tables that hold it, bucketed by key). :func:`register` declares
each node's datasets to Spark as external tables ``CLUSTERED BY`` their key ``INTO BUCKETS
BUCKETS``: every node's rows of a conversation are in the same bucket number, so Spark groups
the union of the nodes' datasets by conversation (or flow key) with no shuffle at all.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from persistence.analytics.flow_facts import FACT_FRAMES, FACTS, fact_keys
from persistence.analytics.session_columns import message_session
from persistence.analytics.session_flows import (
    CONVERSATION,
    FLOW_KEY,
    INITIATOR_KEY,
    INITIATOR_NODE,
    MAX_SEQUENCE,
    ODD,
    OWN,
    RESPONDER,
    RESPONDER_KEY,
    RESPONDER_NODE,
    flow_keys,
    session_keys,
)
from persistence.analytics.waiting import RECEIVE, WAITS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

BUCKETS = 16
"""Buckets of each dataset (the tasks that group it: a few per core of a small cluster)."""
LAYOUT = 5
"""The datasets' version, in the export's manifest: another one is written again."""
EVIDENCE = "evidence"
"""The dataset of session ends, bucketed by :data:`CONVERSATION`."""
FLOWS = "flows"
"""The dataset of flows, bucketed by ``flow_key``."""
WAIT, RECORD, OUTBOX, FACT = 0, 1, 2, 3
"""The kinds of evidence row: a session waited on, a consumed message, an outbox message, a
session in a flow's facts (which shows no session end by itself: it adds what its flow says
of the end, and no ``kinds`` bit)."""
LIVE, FINISHED, FAILED, BLOB = 1, 2, 4, 16
"""Flags of a flow: a checkpoint row, a result, an error, a checkpoint blob."""
EVIDENCE_SCHEMA = (
    (CONVERSATION, "bigint"),
    (RESPONDER, "boolean"),
    ("kinds", "int"),
    (ODD, "boolean"),
    ("outbox_since", "bigint"),
    ("initiator_low", "bigint"),
    ("initiator_high", "bigint"),
    ("responder_low", "bigint"),
    ("responder_high", "bigint"),
    (INITIATOR_KEY, "bigint"),
    (RESPONDER_KEY, "bigint"),
    ("records", "bigint"),
    ("top", "bigint"),
    ("telescope", "bigint"),
    ("sent", "bigint"),
)
"""One row per session end (its conversation and side), summing up its rows: ``kinds``
(:data:`SEEN_WAIT`, :data:`SEEN_RECORD`, :data:`SEEN_OUTBOX`, :data:`SEEN_OWN_WAIT`,
:data:`SEEN_OWN_KNOWN`), any odd row, the oldest outbox message (``outbox_since``), the least
and greatest hash of each node the rows name, the greatest flow keys, of the consumed
messages: how many, the highest sequence number and the XOR of ``h(k) ^ h(k + 1)``, and of
the facts of the flows that hold the end: the fewest messages sent (null: no facts). An end
whose flow says it took in a message above its highest record is odd."""
SEEN_WAIT, SEEN_RECORD, SEEN_OUTBOX, SEEN_OWN_WAIT, SEEN_OWN_KNOWN = 1, 2, 4, 8, 16
"""Bits of ``kinds``: a flow waits on the end, a message was consumed in it, one waits in the
outbox, the flow waiting is the end's own, the end's own flow (the initiating flow of an
initiator end, the responder of a responder end) is in its node's checkpoints, results or
exceptions (known only to the export's datasets)."""
NODE_BOUNDS = ("initiator_low", "initiator_high", "responder_low", "responder_high")
"""The least and greatest hash of each node the rows of a session end name."""
FLOWS_SCHEMA = (("flow_key", "bigint"), ("tables", "int"))
"""The flows columns and their Spark types (``tables``: the flags)."""
_LOWEST = -(1 << 63)


def evidence_rows(frames: dict[str, DataFrame], named: list[str]) -> DataFrame:
    """One row per wait, consumed message, outbox message and session in a flow's facts.

    Columns: the session keys, :data:`OWN`, ``kind``, ``sequence`` (of a consumed message),
    ``created_at`` (of an outbox message), ``sent`` and ``received`` (of a fact). ``named``:
    the nodes whose names were given (see
    :func:`~persistence.analytics.session_flows.session_keys`).
    """
    from pyspark.sql import functions as F

    node, none = F.col("node"), F.lit(None).cast("bigint")

    def shaped(frame: DataFrame, keys: dict[str, Column], kind: int, **values: Column) -> DataFrame:
        own = keys.pop(OWN, F.lit(False))
        named_values = {name: values.get(name, none) for name in _ROW_VALUES}
        return frame.select(
            *[column.alias(name) for name, column in keys.items()],
            own.alias(OWN),
            F.lit(kind).alias("kind"),
            *[column.alias(name) for name, column in named_values.items()],
        )

    waiting = frames["checkpoints"].where(F.col("suspended_on") == RECEIVE)
    exploded = waiting.select("node", "flow_id", F.explode(WAITS).alias("w"))
    waits = session_keys(
        node, F.col("w.session"), F.col("w.counterparty"), named=named, flow_id=F.col("flow_id")
    )
    record = (F.col("message_id"), F.col("sequence"))
    records = session_keys(node, F.col("session_id"), F.col("sender"), named=named, record=record)
    session = message_session(F.col("message_id"))
    outbox = frames["outbox"].where(session != "")
    queued = session_keys(node, session, F.col("target"), named=named)
    rows = (
        shaped(exploded, waits, WAIT)
        .unionByName(shaped(frames["message_ids"], records, RECORD, sequence=F.col("sequence")))
        .unionByName(
            shaped(outbox, queued, OUTBOX, created_at=F.coalesce("created_at", F.lit(_LOWEST)))
        )
    )
    for name in FACT_FRAMES:
        facts = frames[name].select(F.explode(FACTS).alias("f"))
        conversation, responder = fact_keys(F.col("f"))
        keys = {
            CONVERSATION: conversation,
            RESPONDER: F.coalesce(responder, F.lit(False)),
            ODD: F.lit(False),
            **{key: none for key in (INITIATOR_NODE, RESPONDER_NODE, INITIATOR_KEY, RESPONDER_KEY)},
        }
        fact = shaped(facts, keys, FACT, sent=F.col("f.sent"), received=F.col("f.received"))
        rows = rows.unionByName(fact)
    return rows


_ROW_VALUES = ("sequence", "created_at", "sent", "received")


def session_ends(rows: DataFrame, known: DataFrame | None = None) -> DataFrame:
    """:func:`evidence_rows` summed up per session end, in :data:`EVIDENCE_SCHEMA`.

    ``known``: the keys (``flow_key``) of the flows the ends' node holds, for
    :data:`SEEN_OWN_KNOWN` (without them the bit is never set).
    """
    from pyspark.sql import functions as F

    kind, sequence = F.col("kind"), F.col("sequence")
    record, fact = kind == RECORD, kind == FACT
    numbered = record & sequence.isNotNull()

    def bit(condition: Column, flag: int) -> Column:
        return F.when(condition, F.lit(flag)).otherwise(F.lit(0))

    kinds = (
        bit(kind == WAIT, SEEN_WAIT)
        .bitwiseOR(bit(record, SEEN_RECORD))
        .bitwiseOR(bit(kind == OUTBOX, SEEN_OUTBOX))
        .bitwiseOR(bit((kind == WAIT) & F.col(OWN), SEEN_OWN_WAIT))
    )
    after = F.when(sequence < MAX_SEQUENCE, sequence + 1)
    telescope = F.xxhash64(sequence).bitwiseXOR(F.xxhash64(after))
    bounds = []
    for column, prefix in ((INITIATOR_NODE, "initiator"), (RESPONDER_NODE, "responder")):
        shown = F.when(~fact, F.col(column))  # a fact names no node
        bounds += [F.min(shown).alias(f"{prefix}_low"), F.max(shown).alias(f"{prefix}_high")]
    ends = rows.groupBy(CONVERSATION, RESPONDER).agg(
        F.bit_or(kinds).alias("kinds"),
        F.bool_or(F.col(ODD) & ~fact).alias(ODD),
        F.min(F.when(kind == OUTBOX, F.col("created_at"))).alias("outbox_since"),
        *bounds,
        F.max(INITIATOR_KEY).alias(INITIATOR_KEY),
        F.max(RESPONDER_KEY).alias(RESPONDER_KEY),
        F.count(F.when(numbered, True)).alias("records"),
        F.max(F.when(record, sequence)).alias("top"),
        F.bit_xor(F.when(numbered, telescope)).alias("telescope"),
        F.min(F.when(fact, F.col("sent"))).alias("sent"),
        F.max(F.when(fact, F.col("received"))).alias("received"),
    )
    # a flow says it took in a message above the end's highest record: odd (the rules judge)
    top = F.coalesce(F.col("top"), F.lit(-1).cast("bigint"))
    unrecorded = F.coalesce(F.col("received") - 1 > top, F.lit(False))
    kinds_of = F.col("kinds")
    if known is not None:
        own = F.when(F.col(RESPONDER), F.col(RESPONDER_KEY)).otherwise(F.col(INITIATOR_KEY))
        held = known.select(F.col(FLOW_KEY).alias("k_key"), F.lit(True).alias("k_held"))
        ends = ends.join(held, own == F.col("k_key"), "left")
        kinds_of = kinds_of.bitwiseOR(
            bit(F.coalesce(F.col("k_held"), F.lit(False)), SEEN_OWN_KNOWN)
        )
    columns = {
        name: F.col(name).cast(kind) for name, kind in EVIDENCE_SCHEMA if name not in ("kinds", ODD)
    }
    columns["kinds"] = kinds_of.cast("int")
    columns[ODD] = F.coalesce(F.col(ODD), F.lit(False)) | unrecorded
    return ends.select(*[columns[name].alias(name) for name, _ in EVIDENCE_SCHEMA])


def node_flows(frames: dict[str, DataFrame]) -> DataFrame:
    """One row per flow key, with the flags of the tables that hold it (:data:`FLOWS_SCHEMA`)."""
    from pyspark.sql import functions as F

    flags = {"checkpoints": LIVE, "results": FINISHED, "exceptions": FAILED, "blobs": BLOB}
    union: DataFrame | None = None
    for name, flag in flags.items():
        keyed = flow_keys(frames[name], F.lit(flag).alias("flag"))
        union = keyed if union is None else union.unionByName(keyed)
    assert union is not None
    return union.groupBy(FLOW_KEY).agg(F.bit_or("flag").cast("int").alias("tables"))


def write_layout(node_folder: Path, frames: dict[str, DataFrame], node: str) -> dict[str, Any]:
    """Write the node's :data:`EVIDENCE` and :data:`FLOWS` from its ``frames`` (one node's).

    Returns what the manifest keeps of them (version and buckets).
    """
    from pyspark.sql import functions as F

    flows = node_flows(frames).cache()
    try:
        held = flows.where(F.col("tables").bitwiseAND(LIVE | FINISHED | FAILED) != 0)
        ends = session_ends(evidence_rows(frames, [node]), held.select(FLOW_KEY))
        _write_bucketed(ends, CONVERSATION, node_folder / EVIDENCE)
        _write_bucketed(flows, FLOW_KEY, node_folder / FLOWS)
    finally:
        flows.unpersist()
    return {"version": LAYOUT, "buckets": BUCKETS}


def _write_bucketed(data: DataFrame, key: str, target: Path) -> None:
    """``data`` as Spark's bucketed files (:data:`BUCKETS`, by ``key``); replaces ``target``."""
    staging = target.with_name(f"{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    table = f"fiberflow_write_{uuid.uuid4().hex[:12]}"
    # one task per bucket, so one file each
    (
        data.repartition(BUCKETS, key)
        .write.format("parquet")
        .bucketBy(BUCKETS, key)
        .option("path", str(staging.resolve()))
        .saveAsTable(table)
    )
    data.sparkSession.sql(f"DROP TABLE IF EXISTS {table}")  # external: its files stay
    old = target.with_name(f"{target.name}.{os.getpid()}.old")
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def register(
    spark: SparkSession, folders: list[Path], name: str, columns: tuple[tuple[str, str], ...]
) -> tuple[DataFrame, list[str]]:
    """The union of the nodes' ``name`` datasets as bucketed tables, and the tables made.

    Each folder becomes an external table of the session's catalog (dropped by the caller
    when the analysis ends); the union keeps their bucketing
    (``spark.sql.unionOutputPartitioning``).
    """
    key = columns[0][0]
    schema = ", ".join(f"`{column}` {kind.upper()}" for column, kind in columns)
    made: list[str] = []
    union = None
    for folder in folders:
        table = f"fiberflow_{name}_{uuid.uuid4().hex[:12]}"
        location = str(folder.resolve()).replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(
            f"CREATE TABLE {table} ({schema}) USING parquet "
            f"CLUSTERED BY (`{key}`) INTO {BUCKETS} BUCKETS LOCATION '{location}'"
        )
        made.append(table)
        frame = spark.table(table)
        union = frame if union is None else union.unionByName(frame)
    assert union is not None
    return union, made
