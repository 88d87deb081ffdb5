"""What the node tables show about sessions and flows, as DataFrames the checks join.

A node's tables show a session end when a live flow waits on it (``waiting_for`` of a
``Receive``: :func:`waits`), when a message of it was consumed (``node_message_ids``: our
session, the sender, the sequence number) or when a message for it waits in the outbox
(:func:`session_ends`). A flow is known to a node when it is live there or finished
(:func:`known_flows`). A session of a flow that neither waits on it nor has consumed or
queued a message on it is visible only in the checkpoint blob, which is not read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.session_columns import counterpart_flow, is_responder, message_session
from persistence.analytics.session_flows import FLOW_KEY, flow_keys
from persistence.analytics.waiting import RECEIVE, WAITS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from persistence.analytics.snapshot import Snapshot


def waits(checkpoints: DataFrame) -> DataFrame:
    """One row per (flow, session it waits on) of flows suspended on ``Receive``.

    Reads the parsed :data:`~persistence.analytics.waiting.WAITS` column (no JSON parsing).
    """
    from pyspark.sql import functions as F

    receiving = checkpoints.where(F.col("suspended_on") == RECEIVE)
    parsed = receiving.withColumn("wait", F.explode(F.col(WAITS)))
    return parsed.select(
        "*",
        F.col("wait.session").alias("session_id"),
        F.col("wait.counterparty").alias("counterparty"),
    ).drop("wait")


def known_flows(snapshot: Snapshot, only: DataFrame | None = None) -> DataFrame:
    """Every flow a node knows: live (its checkpoint status), ``COMPLETED`` or ``FAILED``.

    One row per (node, flow), with ``tables``: in how many of the node's checkpoints,
    results and exceptions it is (more than one is a node integrity finding). A shared
    frame, built and cached once per snapshot for every check that joins with it (on the
    candidates' snapshot: session consistency, session ownership; the stuck check's full
    list).

    ``only``: a few (``k_node``, ``k_flow``) pairs: the flows of only those, read through a
    broadcast of their flow keys (a scan of each table's keys and statuses, no shuffle), not
    cached.
    """
    from persistence.analytics.check_results import shared

    if only is not None:
        return _known_flows(snapshot, only)
    return shared(snapshot, "known_flows", lambda: _known_flows(snapshot))


def _known_flows(snapshot: Snapshot, only: DataFrame | None = None) -> DataFrame:
    """The live row wins over a result, a result over an error (then the least status).

    Each (status, suspended_on) pair the tables hold gets a number in the order of the pair,
    so the winner is the least of one ``bigint`` per row (rank, then that number): a
    code-generated hash aggregation, where the least of a struct of strings would sort
    every row.
    """
    from pyspark.sql import functions as F

    checkpoints, results, exceptions = snapshot.checkpoints, snapshot.results, snapshot.exceptions
    if only is not None:
        # the few rows of those flows, read in one job and kept (their plan is short again).
        # Matched by the 64-bit flow key, their ids taken from the
        # pairs asked for: the scans read a key, a status and the reason, not every flow's id
        # (the same 2**-64 chance of a colliding key as the screening's)
        wanted = F.broadcast(
            only.select(
                "k_node", "k_flow", F.xxhash64("k_node", "k_flow").alias("k_key")
            ).distinct()
        )

        def of(frame: DataFrame, rank: int) -> DataFrame:
            live = rank == 0
            keyed = flow_keys(
                frame,
                (F.col("status") if live else F.lit(None)).cast("string").alias("status"),
                (F.col("suspended_on") if live else F.lit(None))
                .cast("string")
                .alias("suspended_on"),
            )
            return keyed.join(wanted, F.col(FLOW_KEY) == F.col("k_key")).select(
                F.col("k_node").alias("node"),
                F.col("k_flow").alias("flow_id"),
                F.lit(rank).alias("rank"),
                "status",
                "suspended_on",
            )

        kept = (
            of(checkpoints, 0)
            .unionByName(of(results, 1))
            .unionByName(of(exceptions, 2))
            .localCheckpoint(eager=True)
        )
        checkpoints = kept.where(F.col("rank") == 0)
        results = kept.where(F.col("rank") == 1)
        exceptions = kept.where(F.col("rank") == 2)
    found = checkpoints.select("status", "suspended_on").distinct().collect()
    pairs = {(row["status"], row["suspended_on"]) for row in found}
    pairs |= {("COMPLETED", None), ("FAILED", None)}
    ordered = sorted(pairs, key=lambda pair: tuple((v is not None, v or "") for v in pair))
    size = len(ordered)
    # built in the JVM (no Python data to ship: no Python worker, no accumulator channel)
    rows = [
        F.struct(
            F.lit(code).cast("bigint").alias("code"),
            F.lit(status).cast("string").alias("c_status"),
            F.lit(on).cast("string").alias("c_on"),
        )
        for code, (status, on) in enumerate(ordered)
    ]
    codes = snapshot.spark.range(1).select(F.inline(F.array(*rows)))
    live = checkpoints.join(
        F.broadcast(codes),
        F.col("status").eqNullSafe(F.col("c_status"))
        & F.col("suspended_on").eqNullSafe(F.col("c_on")),
    ).select("node", "flow_id", F.col("code").alias("key"))
    done = results.select(
        "node", "flow_id", F.lit(size + ordered.index(("COMPLETED", None))).alias("key")
    )
    failed = exceptions.select(
        "node", "flow_id", F.lit(2 * size + ordered.index(("FAILED", None))).alias("key")
    )
    union = live.unionByName(done).unionByName(failed)
    best = union.groupBy("node", "flow_id").agg(
        F.min("key").alias("key"), F.count("*").alias("tables")
    )
    code = (F.col("key") % size + 1).cast("int")
    statuses = F.array(*[F.lit(status).cast("string") for status, _ in ordered])
    suspended = F.array(*[F.lit(on).cast("string") for _, on in ordered])
    return best.select(
        "node",
        "flow_id",
        F.element_at(statuses, code).alias("status"),
        F.element_at(suspended, code).alias("suspended_on"),
        "tables",
    )


def session_ends(snapshot: Snapshot) -> DataFrame:
    """Every (node, session, counterparty) the tables show, with how and since when.

    ``evidence`` lists ``waiting`` (a live flow waits on it), ``received`` (a message of it
    was consumed) and ``outbox`` (a message for it waits in the outbox); ``since_ms`` is the
    earliest of those times.
    """
    from pyspark.sql import functions as F

    waiting = waits(snapshot.checkpoints).select(
        "node",
        "session_id",
        "counterparty",
        F.lit("waiting").alias("evidence"),
        F.col("updated_at").alias("at"),
    )
    received = snapshot.message_ids.select(
        "node",
        "session_id",
        F.col("sender").alias("counterparty"),
        F.lit("received").alias("evidence"),
        F.col("inserted_at").alias("at"),
    )
    sent = snapshot.outbox.select(
        "node",
        message_session(F.col("message_id")).alias("session_id"),
        F.col("target").alias("counterparty"),
        F.lit("outbox").alias("evidence"),
        F.col("created_at").alias("at"),
    ).where(F.col("session_id") != "")
    kinds = ("outbox", "received", "waiting")  # in the order the array lists them
    grouped = (
        waiting.unionByName(received)
        .unionByName(sent)
        .groupBy("node", "session_id", "counterparty")
        .agg(  # flags, not a set: a code-generated hash aggregation
            F.min("at").alias("since_ms"),
            *[
                F.max((F.col("evidence") == kind).cast("int")).alias(f"has_{kind}")
                for kind in kinds
            ],
        )
    )
    evidence = F.filter(
        F.array(*[F.when(F.col(f"has_{kind}") == 1, F.lit(kind)) for kind in kinds]),
        lambda kind: kind.isNotNull(),
    )
    return grouped.select(
        "node", "session_id", "counterparty", "since_ms", evidence.alias("evidence")
    )


def judged_session_ends(snapshot: Snapshot) -> DataFrame:
    """:func:`session_ends` with the counterpart flow and its status on the counterparty.

    Adds ``role`` (``initiator`` or ``responder``), ``counterpart_flow_id`` (the flow that
    should hold the other end) and ``counterpart_status`` (its status there from
    :func:`known_flows`, null when that node does not know it). A shared frame: built and
    cached once per snapshot, for every check that asks whether a session end has its
    counterpart.
    """
    from persistence.analytics.check_results import shared

    return shared(snapshot, "judged_session_ends", lambda: _judged_session_ends(snapshot))


def _judged_session_ends(snapshot: Snapshot) -> DataFrame:
    from pyspark.sql import functions as F

    ends = session_ends(snapshot).withColumn(
        "role", F.when(is_responder(F.col("session_id")), "responder").otherwise("initiator")
    )
    ends = ends.withColumn(
        "counterpart_flow_id", counterpart_flow(F.col("node"), F.col("session_id"))
    )
    known = known_flows(snapshot).select(
        F.col("node").alias("k_node"),
        F.col("flow_id").alias("k_flow"),
        F.col("status").alias("counterpart_status"),
    )
    return ends.join(
        known,
        (known.k_node == ends.counterparty) & (known.k_flow == ends.counterpart_flow_id),
        "left",
    ).drop("k_node", "k_flow")
