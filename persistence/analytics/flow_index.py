"""The flow index of the conversation screening: the flows the nodes know, and those missing.

One aggregation brings together every flow the nodes know (the keys of ``node_checkpoints``,
``node_checkpoint_blobs``, ``node_flow_results`` and ``node_flow_exceptions``) with the flow
keys the healthy conversations still need (:mod:`persistence.analytics.screening`): a needed
key no checkpoint, result or exception holds makes its conversation a candidate, a flow in
more than one of those three tables is an **overlap** (what node integrity and the flow counts
need), and a flow with a checkpoint row and no blob, or the reverse, is **unpaired** (what
node integrity needs). With the export's layout the
flows are read bucketed by key, and when only a few keys are needed, they are looked up in
one scan instead of a join.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.layout import FLOWS
from persistence.analytics.session_flows import flow_keys

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot

LIVE, FINISHED, FAILED, NEEDED, BLOB = 1, 2, 4, 8, 16
"""Flags of the flow index: a checkpoint row, a result, an error, a key a conversation needs,
a checkpoint blob (the layout's flags, :mod:`persistence.analytics.layout`)."""
KNOWN = LIVE | FINISHED | FAILED
"""The flags of a flow the rules look up (a flow of which only a blob is left is not)."""


def flow_index(snapshot: Snapshot, judged: DataFrame) -> DataFrame:
    """The needed flow keys no table holds (``missing``), the overlaps and the unpaired flows.

    Needed: by a healthy conversation; an overlap: a flow in more than one of a node's
    checkpoints, results and exceptions; unpaired: a checkpoint row without its blob or the
    reverse. Columns: ``flow_key``, ``missing`` and the flags ``live``, ``finished``,
    ``failed``, ``blob``.
    """
    from pyspark.sql import functions as F

    if FLOWS in snapshot.layouts:
        return _flow_index_of_layout(snapshot.layouts[FLOWS], judged)

    def known(frame: DataFrame, flag: int) -> DataFrame:
        return flow_keys(frame, F.lit(flag).alias("f"))

    union = (
        known(snapshot.checkpoints, LIVE)
        .unionByName(known(snapshot.results, FINISHED))
        .unionByName(known(snapshot.exceptions, FAILED))
        .unionByName(known(snapshot.blobs, BLOB))
        .unionByName(wanted_keys(judged))
    )
    flags = union.groupBy("flow_key").agg(F.bit_or("f").alias("flags"))
    return _flagged(flags)


def wanted_keys(judged: DataFrame) -> DataFrame:
    """The flow keys the healthy conversations need looked up (``flow_key``, ``f``)."""
    from pyspark.sql import functions as F

    healthy = judged.where(~F.col("unusual"))
    return (
        healthy.where("lookup_initiator")
        .select(F.col("initiator_key").alias("flow_key"), F.lit(NEEDED).alias("f"))
        .unionByName(
            healthy.where("lookup_responder").select(
                F.col("responder_key").alias("flow_key"), F.lit(NEEDED).alias("f")
            )
        )
    )


def _flow_index_of_layout(flows: DataFrame, judged: DataFrame) -> DataFrame:
    """:func:`flow_index` from the export's flows, bucketed by key.

    Each flow is one row with its tables already, so the overlaps are a filter, and the
    needed keys no flow holds an anti-join in which only the needed keys move.
    """
    from pyspark.sql import functions as F

    known = flows.select("flow_key", F.col("tables").alias("flags"))
    # the key named anew: Spark then keeps the union's bucketing and moves only the wanted keys
    keys = flows.where(F.col("tables").bitwiseAND(KNOWN) != 0).select(
        F.col("flow_key").alias("flow_key")
    )
    # each needed key once (so the flows are joined once, not once per side of the union)
    wanted = wanted_keys(judged).select("flow_key").distinct()
    missing = wanted.join(keys, "flow_key", "left_anti").select(
        "flow_key", F.lit(NEEDED).alias("flags")
    )
    return _flagged(known.unionByName(missing))


def few_wanted(judged: DataFrame, limit: int) -> list[int] | None:
    """The flow keys the healthy conversations need looked up (at most a few), else None.

    None when there are more than ``limit`` (then they are joined).
    With the export's layout most ends' own flows are known already (``SEEN_OWN_KNOWN``), so
    what is left to look up is usually a handful: an end whose node holds no row of it.
    """
    rows = wanted_keys(judged).select("flow_key").distinct().limit(limit + 1).collect()
    if len(rows) > limit:
        return None
    return sorted(int(row["flow_key"]) for row in rows if row["flow_key"] is not None)


def flow_index_of_few(flows: DataFrame, wanted: list[int]) -> tuple[DataFrame, list[int]]:
    """The index of the overlaps and unpaired flows, and the ``wanted`` keys no table holds.

    The index as :func:`flow_index` gives it (none missing). One scan of the export's flows
    keeps the overlaps, the unpaired flows and the rows of the wanted keys (a set in the
    generated code): no join, no shuffle.
    """
    from pyspark.sql import functions as F

    asked = F.col("flow_key").isin(wanted) if wanted else F.lit(False)
    kept = (
        flows.select("flow_key", F.col("tables").alias("flags"))
        .where(_kept(F.col("flags")) | asked)
        .localCheckpoint(eager=True)
    )
    found: set[int] = set()
    if wanted:
        held = kept.where(F.col("flow_key").isin(wanted) & (F.col("flags").bitwiseAND(KNOWN) != 0))
        found = {int(row["flow_key"]) for row in held.select("flow_key").collect()}
    return _flagged(kept), [key for key in wanted if key not in found]


def _has(flags: Column, flag: int) -> Column:
    return flags.bitwiseAND(flag) != 0


def _kept(flags: Column) -> Column:
    """A flow in more than one of a node's checkpoints, results and exceptions, or unpaired."""
    tables = (
        _has(flags, LIVE).cast("int")
        + _has(flags, FINISHED).cast("int")
        + _has(flags, FAILED).cast("int")
    )
    return (tables > 1) | (_has(flags, LIVE) != _has(flags, BLOB))


def _flagged(flags: DataFrame) -> DataFrame:
    """(``flow_key``, ``flags``) as the index's rows: missing keys, overlaps, unpaired flows."""
    from pyspark.sql import functions as F

    flag = F.col("flags")
    missing = _has(flag, NEEDED) & ~_has(flag, KNOWN)
    return flags.where(missing | _kept(flag)).select(
        "flow_key",
        missing.alias("missing"),
        *[_has(flag, bit).alias(name) for name, bit in _COLUMNS.items()],
    )


_COLUMNS = {"live": LIVE, "finished": FINISHED, "failed": FAILED, "blob": BLOB}


def overlaps_of(index: DataFrame) -> DataFrame:
    """The index's overlaps: ``flow_key``, ``live``, ``finished``, ``failed``."""
    from pyspark.sql import functions as F

    tables = F.col("live").cast("int") + F.col("finished").cast("int") + F.col("failed").cast("int")
    return index.where(tables > 1).select("flow_key", "live", "finished", "failed")


def unpaired_of(index: DataFrame) -> DataFrame:
    """The index's unpaired flows (``flow_key``): a checkpoint row or a blob alone."""
    from pyspark.sql import functions as F

    return index.where(F.col("live") != F.col("blob")).select("flow_key")
