"""The export's analysis layout: each node's session rows and flows, bucketed by their keys.

The conversation screening (:mod:`persistence.analytics.screening`) groups every row that
shows a session end by its conversation, and every flow by its key. Grouping tens of millions
of rows in Spark means moving each of them through a shuffle and a hash table (most of the
screening's time). So the Parquet export also writes, per node, two derived datasets in the
layout Spark's bucketed tables use:

* :data:`EVIDENCE`: one row per session a flow waits on, per consumed message, per outbox
  message and per session in a flow's facts (:mod:`persistence.analytics.flow_facts`), with
  its keys (:mod:`persistence.analytics.session_flows`), summed up per session end as the
  screening reads it (:data:`EVIDENCE_SCHEMA`), in :data:`BUCKETS` files by its conversation;
* :data:`FLOWS`: one row per flow the node knows, its key and which of its tables hold it
  (:data:`LIVE`, :data:`FINISHED`, :data:`FAILED`, :data:`BLOB`), in :data:`BUCKETS` files
  by the flow key.

A row's bucket is what Spark would give it, ``pmod(murmur3(key), BUCKETS)`` (its
``HashPartitioning``; :func:`buckets` computes it with NumPy, and a test holds it to Spark's
``hash``), and each bucket's file is named ``..._<bucket>.parquet`` as Spark's bucketed
writer names it. :func:`register` declares each node's datasets to Spark as external tables
``CLUSTERED BY`` their key ``INTO BUCKETS BUCKETS``: every node's rows of a conversation are
then in the same bucket number, so Spark groups the union of the nodes' tables by
conversation (or by flow key) with no shuffle at all, and joins a frame of flow keys with the
flows by shuffling only that frame.

Both are rebuilt from the node's exported tables after every refresh (Arrow and NumPy, no
Python per row but for the outbox), only for a node named on the command line: the keys hold
its name. The keys themselves are those the export already stores; a node without the
layout is screened from its tables, by Spark.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from persistence.analytics.session_flows import (
    CONVERSATION,
    INITIATOR_KEY,
    INITIATOR_NODE,
    ODD,
    OWN,
    RECORD_KEYS,
    RESPONDER,
    RESPONDER_KEY,
    RESPONDER_NODE,
    python_session_keys,
    spark_xxhash64,
)
from statemachine.session_ids import MESSAGE_ID_PREFIX

if TYPE_CHECKING:
    import numpy
    import pyarrow
    from pyspark.sql import DataFrame, SparkSession

BUCKETS = 16
"""Buckets of each dataset (the tasks that group it: a few per core of a small cluster)."""
LAYOUT = 4
"""The layout's version, in the manifest: another one is not read (the tables are). 4: the
evidence sums up the session facts of each end (``sent``; an end whose flow says it took in
more than its records: ``odd``)."""
EVIDENCE = "evidence"
"""The dataset of session rows, bucketed by :data:`CONVERSATION`."""
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
"""The evidence columns and their Spark types: one row per session end of the node (its
conversation and side), summing up its rows: ``kinds`` (:data:`SEEN_WAIT`,
:data:`SEEN_RECORD`, :data:`SEEN_OUTBOX`, :data:`SEEN_OWN_WAIT`, :data:`SEEN_OWN_KNOWN`),
any odd row, the oldest outbox message (``outbox_since``), the least and greatest hash of
each node the rows name, the greatest flow keys, of the consumed messages: how many, the
highest sequence number and the XOR of ``h(k) ^ h(k + 1)``, and of the facts of the flows
that hold the end: the fewest messages sent (null: no facts); an end whose flow says it took
in a message above its highest record is odd (:mod:`persistence.analytics.screening`)."""
SEEN_WAIT, SEEN_RECORD, SEEN_OUTBOX, SEEN_OWN_WAIT, SEEN_OWN_KNOWN = 1, 2, 4, 8, 16
"""Bits of ``kinds``: a flow waits on the end, a message was consumed in it, one waits in the
outbox, the flow waiting is the end's own, the end's own flow (by the key its rows give: the
initiating flow of an initiator end, the responder of a responder end, both flows of this
node) is in this node's checkpoints, results or exceptions."""
NODE_BOUNDS = ("initiator_low", "initiator_high", "responder_low", "responder_high")
"""The least and greatest hash of each node the rows of a session end name."""
_LOWEST, _HIGHEST = -(1 << 63), (1 << 63) - 1
FLOWS_SCHEMA = (("flow_key", "bigint"), ("tables", "int"))
"""The flows columns and their Spark types (``tables``: the flags)."""

# Java's ``.`` and ``$`` (no MULTILINE): any character but a line terminator; the end, or
# before a final line terminator. So Python reads an outbox id exactly as Spark's
# ``message_session`` (``^N-(.+)-([0-9]+)$``, group 1) does.
_JAVA_ANY = "[^\n\r\u0085\u2028\u2029]"
_JAVA_END = "(?=(?:\r\n|[\n\r\u0085\u2028\u2029])?\\Z)"
_MESSAGE_SESSION = re.compile(f"^{re.escape(MESSAGE_ID_PREFIX)}({_JAVA_ANY}+)-([0-9]+){_JAVA_END}")


# --- writing (the export) ---------------------------------------------------------------------


def buckets(keys: numpy.ndarray, count: int = BUCKETS) -> numpy.ndarray:
    """Spark's bucket of each 64-bit key: ``pmod(murmur3_x86_32(key, seed 42), count)``."""
    import numpy as np

    values = keys.astype(np.int64).view(np.uint64)
    low = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (values >> np.uint64(32)).astype(np.uint32)

    def rotate(x: numpy.ndarray, by: int) -> numpy.ndarray:
        return (x << np.uint32(by)) | (x >> np.uint32(32 - by))

    def mix_key(k: numpy.ndarray) -> numpy.ndarray:
        return rotate(k * np.uint32(0xCC9E2D51), 15) * np.uint32(0x1B873593)

    def mix_hash(h: numpy.ndarray, k: numpy.ndarray) -> numpy.ndarray:
        return rotate(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)

    with np.errstate(over="ignore"):
        h = np.full(values.shape, 42, dtype=np.uint32)
        h = mix_hash(mix_hash(h, mix_key(low)), mix_key(high)) ^ np.uint32(8)
        h = (h ^ (h >> np.uint32(16))) * np.uint32(0x85EBCA6B)
        h = (h ^ (h >> np.uint32(13))) * np.uint32(0xC2B2AE35)
        h = h ^ (h >> np.uint32(16))
    return np.mod(h.view(np.int32).astype(np.int64), count).astype(np.int32)


def _arrow_schema(columns: tuple[tuple[str, str], ...]) -> pyarrow.Schema:
    import pyarrow as pa

    kinds = {"bigint": pa.int64(), "boolean": pa.bool_(), "int": pa.int32()}
    return pa.schema([(name, kinds[kind]) for name, kind in columns])


_RAW_SCHEMA = (
    (CONVERSATION, "bigint"),
    (RESPONDER, "boolean"),
    ("kind", "int"),
    (ODD, "boolean"),
    (OWN, "boolean"),
    (INITIATOR_NODE, "bigint"),
    (RESPONDER_NODE, "bigint"),
    (INITIATOR_KEY, "bigint"),
    (RESPONDER_KEY, "bigint"),
    ("sequence", "bigint"),
    ("created_at", "bigint"),
)


def _waits(checkpoints: pyarrow.Table) -> pyarrow.Table:
    """One row per session a checkpoint waits on (its stored keys)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    receiving = checkpoints.filter(pc.equal(checkpoints["suspended_on"], "Receive"))
    items = pc.list_flatten(receiving["waits"])
    size = len(items)

    def field(name: str, default: Any, kind: pyarrow.DataType) -> pyarrow.Array:
        values = pc.struct_field(items, name) if size else pa.array([], kind)
        # an element that was not an object has no keys: Spark gives it these
        return pc.fill_null(values, default) if default is not None else values

    return pa.table(
        {
            CONVERSATION: field(CONVERSATION, spark_xxhash64(None), pa.int64()),
            RESPONDER: field(RESPONDER, False, pa.bool_()),
            "kind": pa.array([WAIT] * size, pa.int32()),
            ODD: field(ODD, True, pa.bool_()),
            OWN: field(OWN, False, pa.bool_()),
            INITIATOR_NODE: field(INITIATOR_NODE, None, pa.int64()),
            RESPONDER_NODE: field(RESPONDER_NODE, None, pa.int64()),
            INITIATOR_KEY: field(INITIATOR_KEY, None, pa.int64()),
            RESPONDER_KEY: field(RESPONDER_KEY, None, pa.int64()),
            "sequence": pa.nulls(size, pa.int64()),
            "created_at": pa.nulls(size, pa.int64()),
        },
        schema=_arrow_schema(_RAW_SCHEMA),
    )


def _records(message_ids: pyarrow.Table) -> pyarrow.Table:
    """Each consumed message (its stored keys)."""
    import pyarrow as pa

    size = len(message_ids)
    columns = {name: message_ids[name] for name in RECORD_KEYS}
    return pa.table(
        {
            **{name: columns[name] for name in (CONVERSATION, RESPONDER)},
            "kind": pa.array([RECORD] * size, pa.int32()),
            ODD: columns[ODD],
            OWN: pa.array([False] * size, pa.bool_()),
            **{
                name: columns[name]
                for name in (INITIATOR_NODE, RESPONDER_NODE, INITIATOR_KEY, RESPONDER_KEY)
            },
            "sequence": message_ids["sequence"],
            "created_at": pa.nulls(size, pa.int64()),
        },
        schema=_arrow_schema(_RAW_SCHEMA),
    )


def outbox_session(message_id: str | None) -> str:
    """The sender's session of an outbox message id, as Spark reads it ("" when none)."""
    if message_id is None:
        return ""
    match = _MESSAGE_SESSION.match(message_id)
    return match.group(1) if match else ""


def _outbox(outbox: pyarrow.Table, node: str) -> pyarrow.Table:
    """Each outbox message of a session (the keys computed here: the outbox is small)."""
    import pyarrow as pa

    rows: dict[str, list[Any]] = {name: [] for name, _ in _RAW_SCHEMA}
    for message_id, target, created_at in zip(
        outbox["message_id"].to_pylist(),
        outbox["target"].to_pylist(),
        outbox["created_at"].to_pylist(),
        strict=True,
    ):
        session = outbox_session(message_id)
        if session == "":
            continue
        keys = python_session_keys(node, session, target)
        assert keys is not None
        values = {**keys, "kind": OUTBOX, OWN: False, "sequence": None, "created_at": created_at}
        for name, _ in _RAW_SCHEMA:
            rows[name].append(values[name])
    return pa.table(rows, schema=_arrow_schema(_RAW_SCHEMA))


def _facts(flows: pyarrow.Table) -> pyarrow.Table:
    """Each session in the flow rows' facts (their stored keys), as evidence of kind FACT."""
    import pyarrow as pa
    import pyarrow.compute as pc

    items = pc.list_flatten(flows["facts"])
    size = len(items)

    def field(name: str, kind: pyarrow.DataType) -> pyarrow.Array:
        return pc.struct_field(items, name) if size else pa.array([], kind)

    return pa.table(
        {
            CONVERSATION: field(CONVERSATION, pa.int64()),
            RESPONDER: field(RESPONDER, pa.bool_()),
            "kind": pa.array([FACT] * size, pa.int32()),
            "sent": field("sent", pa.int64()),
            "received": field("received", pa.int64()),
        }
    )


def sequence_hash(numbers: numpy.ndarray) -> numpy.ndarray:
    """Spark's ``xxhash64`` of 64-bit integers (XXH64 of their 8 bytes, seed 42), in NumPy."""
    import numpy as np

    primes = [
        np.uint64(p)
        for p in (
            0x9E3779B185EBCA87,
            0xC2B2AE3D27D4EB4F,
            0x165667B19E3779F9,
            0x85EBCA77C2B2AE63,
            0x27D4EB2F165667C5,
        )
    ]
    one, two, three, four, five = primes

    def rotate(x: numpy.ndarray, by: int) -> numpy.ndarray:
        return (x << np.uint64(by)) | (x >> np.uint64(64 - by))

    values = numbers.astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        h = np.full(values.shape, np.uint64(42) + five + np.uint64(8), dtype=np.uint64)
        h = rotate(h ^ (rotate(values * two, 31) * one), 27) * one + four
        h = (h ^ (h >> np.uint64(33))) * two
        h = (h ^ (h >> np.uint64(29))) * three
        h = h ^ (h >> np.uint64(32))
    return h.view(np.int64)


def _session_ends(rows: pyarrow.Table, known_flows: numpy.ndarray) -> pyarrow.Table:
    """The node's rows summed up per session end (conversation and side), as evidence.

    What the screening reads of a conversation is a bit-or, a minimum or maximum, a count
    or an XOR of its rows, so each side's rows on this node can be summed up here (NumPy,
    sorted by end) and Spark groups half as many rows. ``known_flows``: the sorted keys of
    the flows in this node's checkpoints, results or exceptions; an end whose own flow is
    one of them gets :data:`SEEN_OWN_KNOWN` (the screening then need not look it up).
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def column(name: str, empty: int) -> numpy.ndarray:
        values: numpy.ndarray = pc.fill_null(rows[name], empty).to_numpy(zero_copy_only=False)
        return values

    conversation = column(CONVERSATION, 0).astype(np.int64)
    responder = column(RESPONDER, False).astype(bool)
    order = np.lexsort((responder, conversation))
    conversation, responder = conversation[order], responder[order]
    kind = column("kind", -1)[order]
    fact = kind == FACT  # a fact's own columns are null: it adds to no other sum
    odd = column(ODD, True).astype(bool)[order] & ~fact
    own = column(OWN, False).astype(bool)[order]
    record = kind == RECORD
    kinds = (
        np.where(kind == WAIT, SEEN_WAIT, 0)
        | np.where(record, SEEN_RECORD, 0)
        | np.where(kind == OUTBOX, SEEN_OUTBOX, 0)
        | np.where((kind == WAIT) & own, SEEN_OWN_WAIT, 0)
    ).astype(np.int32)
    created = column("created_at", _LOWEST)[order]
    sequence = column("sequence", _LOWEST)[order]
    known_sequence = pc.is_valid(rows["sequence"]).to_numpy(zero_copy_only=False)[order]
    telescope = sequence_hash(sequence) ^ sequence_hash(sequence + 1)
    if len(conversation):
        starts = np.flatnonzero(
            np.concatenate(
                (
                    [True],
                    (conversation[1:] != conversation[:-1]) | (responder[1:] != responder[:-1]),
                )
            )
        )
    else:
        starts = np.zeros(0, dtype=np.int64)

    def fold(ufunc: numpy.ufunc, values: numpy.ndarray) -> numpy.ndarray:
        return ufunc.reduceat(values, starts) if len(starts) else values[:0]

    def node(name: str, ufunc: numpy.ufunc) -> pyarrow.Array:
        values = column(name, 0).astype(np.int64)[order]
        empty = _HIGHEST if ufunc is np.minimum else _LOWEST
        folded = fold(ufunc, np.where(fact, empty, values))
        return pa.array(folded, pa.int64(), mask=folded == empty)  # null: facts alone

    def key(values: numpy.ndarray) -> pyarrow.Array:
        return pa.array(values, pa.int64(), mask=values == _LOWEST)

    initiator_keys = fold(np.maximum, column(INITIATOR_KEY, _LOWEST).astype(np.int64)[order])
    responder_keys = fold(np.maximum, column(RESPONDER_KEY, _LOWEST).astype(np.int64)[order])
    sides = responder[starts] if len(starts) else responder[:0]
    own_keys = np.where(sides, responder_keys, initiator_keys)
    known = (own_keys != _LOWEST) & _contains(known_flows, own_keys)
    counted = fold(np.add, (record & known_sequence).astype(np.int64))
    top = fold(np.maximum, np.where(record, sequence, _LOWEST))
    since = fold(np.minimum, np.where(kind == OUTBOX, created, _HIGHEST))
    sent = fold(np.minimum, np.where(fact, column("sent", _HIGHEST)[order], _HIGHEST))
    # a flow says it took in a message above the end's highest record: odd (the rules judge)
    received = fold(np.maximum, np.where(fact, column("received", 0)[order], 0))
    told = fold(np.logical_or, fact)
    unrecorded = told & (received - 1 > np.where(top == _LOWEST, -1, top))
    return pa.table(
        {
            CONVERSATION: conversation[starts],
            RESPONDER: responder[starts],
            "kinds": fold(np.bitwise_or, kinds)
            | np.where(known, SEEN_OWN_KNOWN, 0).astype(np.int32),
            ODD: fold(np.logical_or, odd) | unrecorded,
            "outbox_since": since,
            "initiator_low": node(INITIATOR_NODE, np.minimum),
            "initiator_high": node(INITIATOR_NODE, np.maximum),
            "responder_low": node(RESPONDER_NODE, np.minimum),
            "responder_high": node(RESPONDER_NODE, np.maximum),
            INITIATOR_KEY: key(initiator_keys),
            RESPONDER_KEY: key(responder_keys),
            "records": counted,
            "top": pa.array(top, pa.int64(), mask=top == _LOWEST),
            "telescope": fold(np.bitwise_xor, np.where(record & known_sequence, telescope, 0)),
            "sent": pa.array(sent, pa.int64(), mask=sent == _HIGHEST),
        },
        schema=_arrow_schema(EVIDENCE_SCHEMA),
    )


def _contains(sorted_keys: numpy.ndarray, keys: numpy.ndarray) -> numpy.ndarray:
    """Whether each of ``keys`` is in ``sorted_keys`` (ascending)."""
    import numpy as np

    if not len(sorted_keys):
        return np.zeros(keys.shape, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    found: numpy.ndarray = sorted_keys[at] == keys
    return found


def _known_flows(flows: pyarrow.Table) -> numpy.ndarray:
    """The sorted keys of the flows in a checkpoint row, a result or an exception."""
    import numpy as np
    import pyarrow.compute as pc

    tables = flows["tables"].to_numpy(zero_copy_only=False)
    keys = pc.fill_null(flows["flow_key"], _LOWEST).to_numpy(zero_copy_only=False)
    held = ((tables & (LIVE | FINISHED | FAILED)) != 0) & (keys != _LOWEST)
    return np.sort(keys[held].astype(np.int64))


def _flows(tables: dict[str, pyarrow.Table]) -> pyarrow.Table:
    """One row per flow key of the node, with the flags of the tables that hold it."""
    import pyarrow as pa

    flags = {"checkpoints": LIVE, "results": FINISHED, "exceptions": FAILED, "blobs": BLOB}
    parts = [
        pa.table(
            {
                "flow_key": tables[name]["flow_key"],
                "tables": pa.array([flag] * len(tables[name]), pa.int32()),
            }
        )
        for name, flag in flags.items()
    ]
    each = pa.concat_tables(parts).group_by(["flow_key", "tables"]).aggregate([])
    summed = each.group_by("flow_key").aggregate([("tables", "sum")])
    return pa.table(
        {"flow_key": summed["flow_key"], "tables": summed["tables_sum"].cast(pa.int32())},
        schema=_arrow_schema(FLOWS_SCHEMA),
    )


def _write_bucketed(data: pyarrow.Table, key: str, target: Path, prefix: str) -> None:
    """``data`` as :data:`BUCKETS` files by ``key``, each sorted by it; replaces ``target``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    keys = pc.fill_null(data[key], spark_xxhash64(None)).to_numpy(zero_copy_only=False)
    numbers = buckets(keys) if len(keys) else np.zeros(0, np.int32)
    data = data.append_column("_bucket", pa.array(numbers, pa.int32()))
    data = data.sort_by([("_bucket", "ascending"), (key, "ascending")])
    ordered = data["_bucket"].to_numpy()
    data = data.drop_columns(["_bucket"])
    staging = target.with_name(f"{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    staging.mkdir(parents=True)
    edges = np.searchsorted(ordered, np.arange(BUCKETS + 1))
    for bucket in range(BUCKETS):
        part = data.slice(int(edges[bucket]), int(edges[bucket + 1] - edges[bucket]))
        pq.write_table(part, staging / f"{prefix}_{bucket:05d}.parquet")
    old = target.with_name(f"{target.name}.{os.getpid()}.old")
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def write_layout(node_folder: Path, node: str) -> dict[str, Any]:
    """Rebuild the node's :data:`EVIDENCE` and :data:`FLOWS` from its exported tables.

    Returns what the manifest keeps of it (version, buckets, rows).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    def read(frame: str, columns: list[str]) -> pyarrow.Table:
        return pq.read_table(node_folder / f"{frame}.parquet", columns=columns)

    flow_tables = ("checkpoints", "results", "exceptions", "blobs")
    flows = _flows({frame: read(frame, ["flow_key"]) for frame in flow_tables})
    facts = [_facts(read(frame, ["facts"])) for frame in ("checkpoints", "results", "exceptions")]
    evidence = _session_ends(
        pa.concat_tables(
            [
                _waits(read("checkpoints", ["suspended_on", "waits"])),
                _records(read("message_ids", [*RECORD_KEYS, "sequence"])),
                _outbox(read("outbox", ["message_id", "target", "created_at"]), node),
                *facts,
            ],
            promote_options="default",  # a column one kind lacks is null there
        ),
        _known_flows(flows),
    )
    prefix = node_folder.name
    _write_bucketed(evidence, CONVERSATION, node_folder / EVIDENCE, prefix)
    _write_bucketed(flows, "flow_key", node_folder / FLOWS, prefix)
    return {"version": LAYOUT, "buckets": BUCKETS, EVIDENCE: len(evidence), FLOWS: len(flows)}


# --- reading (the analysis) -------------------------------------------------------------------


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
