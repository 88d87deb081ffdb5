"""The flow index of the conversation screening: the flows the nodes know, and those missing.

One aggregation brings together every flow the nodes know (the keys of ``node_checkpoints``,
``node_flow_results`` and ``node_flow_exceptions``) with the flow keys the healthy
conversations still need (:mod:`persistence.analytics.screening`): a needed key no node table
holds makes its conversation a candidate, and a flow in more than one of the three tables is
an **overlap** (what node integrity and the flow counts need). With the export's layout the
flows are read bucketed by key, and when only a few keys are needed, they are looked up in
one scan instead of a join.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.layout import FLOWS
from persistence.analytics.session_flows import flow_keys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from persistence.analytics.snapshot import Snapshot

LIVE, FINISHED, FAILED, NEEDED = 1, 2, 4, 8
"""Flags of the flow index: a checkpoint row, a result, an error, a key a conversation needs."""


def flow_index(snapshot: Snapshot, judged: DataFrame) -> DataFrame:
    """The needed flow keys no table holds (``missing``), and the overlaps, with their flags.

    Needed: by a healthy conversation; an overlap: a flow in more than one of a node's
    checkpoints, results and exceptions.
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

    flags = F.col("tables").bitwiseAND(LIVE | FINISHED | FAILED)
    known = flows.select("flow_key", flags.alias("flags"))
    # the key named anew: Spark then keeps the union's bucketing and moves only the wanted keys.
    # A flow of which only a checkpoint blob is left is not known (as in the tables' index:
    # the rules look flows up in checkpoints, results and exceptions)
    keys = flows.where(flags != 0).select(F.col("flow_key").alias("flow_key"))
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
    """The overlaps (as :func:`flow_index` gives them) and the ``wanted`` keys no table holds.

    One scan of the export's flows keeps the overlaps and the rows of the wanted keys (a set
    in the generated code): no join, no shuffle. A flow of which only a checkpoint blob is
    left is not known.
    """
    from pyspark.sql import functions as F

    flags = F.col("tables").bitwiseAND(LIVE | FINISHED | FAILED)
    tables = sum(
        (flags.bitwiseAND(flag).cast("boolean").cast("int") for flag in (LIVE, FINISHED, FAILED)),
        F.lit(0),
    )
    asked = F.col("flow_key").isin(wanted) if wanted else F.lit(False)
    kept = (
        flows.where((tables > 1) | asked)
        .select("flow_key", flags.alias("flags"))
        .localCheckpoint(eager=True)
    )
    found: set[int] = set()
    if wanted:
        held = kept.where(F.col("flow_key").isin(wanted) & (F.col("flags") != 0))
        found = {int(row["flow_key"]) for row in held.select("flow_key").collect()}
    overlaps = _flagged(kept).drop("missing")
    return overlaps, [key for key in wanted if key not in found]


def _flagged(flags: DataFrame) -> DataFrame:
    """(``flow_key``, ``flags``) as the index's rows: missing keys and overlaps only."""
    from pyspark.sql import functions as F

    tables = (
        F.col("flags").bitwiseAND(LIVE).cast("boolean").cast("int")
        + F.col("flags").bitwiseAND(FINISHED).cast("boolean").cast("int")
        + F.col("flags").bitwiseAND(FAILED).cast("boolean").cast("int")
    )
    missing = F.col("flags") == NEEDED
    return flags.where(missing | (tables > 1)).select(
        "flow_key",
        missing.alias("missing"),
        F.col("flags").bitwiseAND(LIVE).cast("boolean").alias("live"),
        F.col("flags").bitwiseAND(FINISHED).cast("boolean").alias("finished"),
        F.col("flags").bitwiseAND(FAILED).cast("boolean").alias("failed"),
    )
