"""The node integrity check: each node's own tables agree about every flow (``fail``).

A node writes a flow's checkpoint row (``node_checkpoints``) and its blob
(``node_checkpoint_blobs``) in one statement pair of one transaction
(``SqlTransaction.put_checkpoints``) and deletes both together (``remove_checkpoints``); no
other code inserts or deletes either (status updates touch the row only). A flow that ends
removes its checkpoint in the same transaction that stores its result or its error
(``statemachine/transitions/ending.py``), and a refused flow request stores an error without
ever having had a checkpoint. So in a consistent snapshot:

* every checkpoint row has its blob, and every blob its row (a flow that is ``UNSTARTED`` or
  ``RUNNABLE`` has both too: its first checkpoint is written with its row);
* no flow is both finished (a row in ``node_flow_results`` or ``node_flow_exceptions``) and
  live (a checkpoint row), and none both completed and failed.

The blob itself is never read. Most flows are fine, so the check takes the few flows that
may not be from the conversation screening's flow index
(:mod:`persistence.analytics.flow_index`: the overlaps and the unpaired flows, by their
64-bit keys), then one aggregation over the four tables' rows of those flows only
(:func:`flow_facts`) says what is wrong with each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.check_results import (
    FAIL,
    OK,
    CheckResult,
    CheckSettings,
    Verdict,
    count_with_first_rows,
    keep,
    keep_in_order,
)
from persistence.analytics.screening import screen
from persistence.analytics.session_flows import FLOW_KEY, flow_keys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from persistence.analytics.snapshot import Snapshot

ROW_WITHOUT_BLOB = "checkpoint_without_blob"
"""A live checkpoint row whose blob row is missing: the node cannot load the flow."""
BLOB_WITHOUT_ROW = "blob_without_checkpoint"
"""A checkpoint blob without its row: a flow the node does not list nor resume."""
FINISHED_AND_LIVE = "finished_and_live"
"""A flow with a stored result or error and a live checkpoint."""
COMPLETED_AND_FAILED = "completed_and_failed"
"""A flow with both a stored result and a stored error."""
TAGS = ("live", "blob", "completed", "failed")
"""What :func:`flow_facts` says of each flow: a checkpoint row, a blob, a result, an error."""
KINDS = (ROW_WITHOUT_BLOB, BLOB_WITHOUT_ROW, FINISHED_AND_LIVE, COMPLETED_AND_FAILED)
"""The kinds of findings, in report order."""
BROADCAST_ROWS = 200_000
"""Up to this many suspect flows, the four tables are filtered by them through a broadcast
(a scan, no shuffle); more use a plain join."""


def suspect_flows(snapshot: Snapshot, settings: CheckSettings) -> DataFrame:
    """The keys (``flow_key``) of the flows that may be findings, cached.

    The screening's overlaps (a flow in more than one of a node's checkpoints, results and
    exceptions) and unpaired flows (a checkpoint row without its blob, or the reverse).
    """
    found = screen(snapshot, settings)
    suspects = found.overlaps.select(FLOW_KEY).unionByName(found.unpaired.select(FLOW_KEY))
    return keep(snapshot, suspects.distinct())


def flow_facts(snapshot: Snapshot, only: DataFrame | None = None) -> DataFrame:
    """One row per (node, flow) any of the four flow tables holds, with what each says.

    ``only``: the keys (``flow_key``, :func:`~persistence.analytics.screening.flow_key`) of
    the flows to describe (every flow when None).

    Columns: ``node``, ``flow_id``, ``flow_class`` (from the checkpoint row, else the
    result, else the error; null for a lone blob), ``status`` (the checkpoint row's),
    ``live``, ``blob``, ``completed``, ``failed`` (booleans) and ``at`` (the latest time any
    of them records).
    """
    from pyspark.sql import functions as F

    def part(frame: DataFrame, tag: str, rank: int, klass: str | None, at: str | None) -> DataFrame:
        return frame.select(
            "node",
            "flow_id",
            F.lit(tag).alias("tag"),
            F.struct(
                F.lit(rank).alias("rank"),
                (F.col(klass) if klass else F.lit(None).cast("string")).alias("flow_class"),
            ).alias("klass"),
            (F.col("status") if tag == "live" else F.lit(None).cast("string")).alias("status"),
            (F.col(at) if at else F.lit(None).cast("long")).alias("at"),
        )

    wanted = None
    if only is not None:
        wanted = only.select(F.col("flow_key").alias("o_key"))
        if only.count() <= BROADCAST_ROWS:
            wanted = F.broadcast(wanted)

    def of(frame: DataFrame) -> DataFrame:
        if wanted is None:
            return frame
        keyed = flow_keys(frame, *[c for c in frame.columns if c != FLOW_KEY])
        return keyed.join(wanted, F.col(FLOW_KEY) == F.col("o_key"), "left_semi")

    union = (
        part(of(snapshot.checkpoints), "live", 0, "flow_class", "updated_at")
        .unionByName(part(of(snapshot.blobs), "blob", 3, None, None))
        .unionByName(part(of(snapshot.results), "completed", 1, "flow_class", "completed_at"))
        .unionByName(part(of(snapshot.exceptions), "failed", 2, "flow_class", "failed_at"))
    )
    facts = union.groupBy("node", "flow_id").agg(
        F.collect_set("tag").alias("tags"),
        F.min("klass").alias("klass"),
        F.max("status").alias("status"),
        F.max("at").alias("at"),
    )
    return facts.select(
        "node",
        "flow_id",
        F.col("klass.flow_class").alias("flow_class"),
        "status",
        *[
            F.array_contains("tags", tag).alias(tag)
            for tag in ("live", "blob", "completed", "failed")
        ],
        "at",
    )


def node_integrity(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Node integrity: checkpoint rows and blobs pair up, and no flow is finished and live.

    One row per finding: ``node``, ``flow_id``, ``flow_class``, ``kind`` (one of
    :data:`KINDS`), ``status`` (the checkpoint row's, if any), ``at`` (the latest time the
    tables record for the flow) and a one-line ``reason``. A flow both finished and live is
    one finding (``finished_and_live``) even if its blob is missing too. ``fail`` when any.
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    facts = flow_facts(snapshot, only=suspect_flows(snapshot, settings))
    finished = F.col("completed") | F.col("failed")
    outcome = F.when(F.col("completed"), F.lit("a result")).otherwise(F.lit("an error"))
    kind = (
        F.when(F.col("live") & finished, FINISHED_AND_LIVE)
        .when(F.col("completed") & F.col("failed"), COMPLETED_AND_FAILED)
        .when(F.col("live") & ~F.col("blob"), ROW_WITHOUT_BLOB)
        .when(F.col("blob") & ~F.col("live"), BLOB_WITHOUT_ROW)
    )
    reason = (
        F.when(
            F.col("kind") == FINISHED_AND_LIVE,
            F.concat(
                F.lit("finished (the node stored "),
                outcome,
                F.lit(") yet its checkpoint row is still there ("),
                F.col("status"),
                F.lit("): the node counts it finished and will not resume it"),
            ),
        )
        .when(
            F.col("kind") == COMPLETED_AND_FAILED,
            F.lit("the node stored both a result and an error for it"),
        )
        .when(
            F.col("kind") == ROW_WITHOUT_BLOB,
            F.concat(
                F.lit("its checkpoint row ("),
                F.col("status"),
                F.lit(") has no blob in node_checkpoint_blobs: the node cannot load it"),
            ),
        )
        .otherwise(
            F.lit(
                "a blob in node_checkpoint_blobs without its checkpoint row: the node "
                "neither lists nor resumes it"
            )
        )
    )
    findings = (
        facts.withColumn("kind", kind)
        .where(F.col("kind").isNotNull())
        .select(
            "node",
            "flow_id",
            F.coalesce("flow_class", F.lit("unknown")).alias("flow_class"),
            "kind",
            "status",
            "at",
            reason.alias("reason"),
        )
    )
    findings = keep_in_order(snapshot, findings, "node", "kind", "flow_id")
    counts, first = count_with_first_rows(findings, "kind", settings.report_rows)
    found = sum(counts.values())
    if found:
        detail = ", ".join(f"{counts[k]} {k.replace('_', ' ')}" for k in KINDS if k in counts)
        verdict = Verdict(FAIL, f"{found} flow{'s' if found != 1 else ''}: {detail}", found)
    else:
        verdict = Verdict(OK, "every checkpoint row has its blob; no flow is finished and live")
    return CheckResult("node_integrity", "Node integrity", findings, verdict, first=first)
