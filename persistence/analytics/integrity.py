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

One aggregation over the union of the four tables' ``(node, flow_id)`` answers every
question (no join); the blob itself is never read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.checking import FAIL, OK, CheckResult, CheckSettings, Verdict, keep

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


def flow_facts(snapshot: Snapshot) -> DataFrame:
    """One row per (node, flow) any of the four flow tables holds, with what each says.

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

    union = (
        part(snapshot.checkpoints, "live", 0, "flow_class", "updated_at")
        .unionByName(part(snapshot.blobs, "blob", 3, None, None))
        .unionByName(part(snapshot.results, "completed", 1, "flow_class", "completed_at"))
        .unionByName(part(snapshot.exceptions, "failed", 2, "flow_class", "failed_at"))
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

    facts = flow_facts(snapshot)
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
        .orderBy("node", "kind", "flow_id")
    )
    findings = keep(snapshot, findings)
    counts = {
        row["kind"]: row["findings"]
        for row in findings.groupBy("kind").agg(F.count("*").alias("findings")).collect()
    }
    found = sum(counts.values())
    if found:
        detail = ", ".join(f"{counts[k]} {k.replace('_', ' ')}" for k in KINDS if k in counts)
        verdict = Verdict(FAIL, f"{found} flow{'s' if found != 1 else ''}: {detail}", found)
    else:
        verdict = Verdict(OK, "every checkpoint row has its blob; no flow is finished and live")
    return CheckResult("node_integrity", "Node integrity", findings, verdict)
