"""The stuck-flow check: flows suspended for longer than ``stuck_after_ms`` (``warn``).

A flow waiting on a receive is shown with the flow that should hold the other end of each
session it waits on, and that flow's status on the counterparty's node, so an operator sees
at once whether the peer is gone, finished or waiting too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.checking import (
    OK,
    WARN,
    CheckResult,
    CheckSettings,
    Verdict,
    as_of_ms,
    duration,
    is_analyzed,
    keep,
)
from persistence.analytics.evidence import known_flows, waits
from persistence.analytics.session_columns import counterpart_flow

if TYPE_CHECKING:
    from persistence.analytics.snapshot import Snapshot


def stuck_flows(snapshot: Snapshot, settings: CheckSettings | None = None) -> CheckResult:
    """Flows suspended longer than ``stuck_after_ms``, with what they wait for.

    * suspended on ``Receive`` with the checkpoint older than the threshold: one row per
      session waited on, with the counterparty, the flow that should hold the other end
      (``counterpart_flow_id``), its status there (``COMPLETED``, ``SUSPENDED``, ...,
      ``missing``, or ``not analyzed`` when the counterparty's database was not given) and
      ``counterparty_has_session`` (its flow is live);
    * suspended on ``Sleep`` whose wake-up time passed more than the threshold ago;
    * ``UNSTARTED`` or ``RUNNABLE`` with no checkpoint for longer than the threshold (its
      node is not running it).

    Flows in the hospital are left to :func:`failed_flows`; flows an operator paused
    (``node_paused_flows``) are not judged but listed in ``extras["paused"]``. ``warn`` when
    any is found.
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    as_of = as_of_ms(snapshot, settings)
    limit = as_of - settings.stuck_after_ms
    paused = snapshot.paused.select(
        F.col("node").alias("p_node"), F.col("flow_id").alias("p_flow"), "paused_at"
    )
    live = snapshot.checkpoints
    on_hold = (live.node == paused.p_node) & (live.flow_id == paused.p_flow)
    checkpoints = live.where(F.col("status") != "HOSPITALIZED").join(paused, on_hold, "left_anti")
    held = keep(
        snapshot,
        live.join(paused, on_hold)
        .select("node", "flow_id", "flow_class", "status", "suspended_on", "paused_at")
        .orderBy("node", "flow_id"),
    )
    receiving = waits(checkpoints).where(F.col("updated_at") <= limit)
    known = known_flows(snapshot).select(
        F.col("node").alias("k_node"),
        F.col("flow_id").alias("k_flow"),
        F.col("status").alias("counterpart_status"),
    )
    receiving = receiving.withColumn(
        "counterpart_flow_id", counterpart_flow(F.col("node"), F.col("session_id"))
    )
    receiving = receiving.join(
        known,
        (known.k_node == receiving.counterparty) & (known.k_flow == receiving.counterpart_flow_id),
        "left",
    )
    analyzed = is_analyzed(snapshot, F.col("counterparty"))
    live_states = ("UNSTARTED", "RUNNABLE", "SUSPENDED", "HOSPITALIZED")
    receiving = receiving.select(
        "node",
        "flow_id",
        "flow_class",
        "status",
        "suspended_on",
        (F.lit(as_of) - F.col("updated_at")).alias("waited_ms"),
        "session_id",
        "counterparty",
        "counterpart_flow_id",
        F.when(~analyzed, F.lit("not analyzed"))
        .when(F.col("counterpart_status").isNull(), F.lit("missing"))
        .otherwise(F.col("counterpart_status"))
        .alias("counterpart_status"),
        F.when(~analyzed, F.lit(None).cast("boolean"))
        .otherwise(
            F.col("counterpart_status").isin(*live_states) & F.col("counterpart_status").isNotNull()
        )
        .alias("counterparty_has_session"),
    )
    until = F.get_json_object("waiting_for", "$.until").cast("bigint")
    sleeping = checkpoints.where((F.col("suspended_on") == "Sleep") & (until <= limit))
    idle = checkpoints.where(
        F.col("status").isin("UNSTARTED", "RUNNABLE") & (F.col("updated_at") <= limit)
    )
    others = sleeping.withColumn("waited_ms", F.lit(as_of) - until).unionByName(
        idle.withColumn("waited_ms", F.lit(as_of) - F.col("updated_at"))
    )
    others = others.select(
        "node",
        "flow_id",
        "flow_class",
        "status",
        "suspended_on",
        "waited_ms",
        *[
            F.lit(None).cast(kind).alias(name)
            for name, kind in (
                ("session_id", "string"),
                ("counterparty", "string"),
                ("counterpart_flow_id", "string"),
                ("counterpart_status", "string"),
                ("counterparty_has_session", "boolean"),
            )
        ],
    )
    frame = keep(
        snapshot, receiving.unionByName(others).orderBy(F.desc("waited_ms"), "node", "flow_id")
    )
    flows = frame.select("node", "flow_id").distinct().count()
    threshold = duration(settings.stuck_after_ms)
    on_pause = held.count()
    aside = f" ({on_pause} paused by an operator, not judged)" if on_pause else ""
    if flows:
        verdict = Verdict(
            WARN,
            f"{flows} flow{'s' if flows != 1 else ''} stuck for more than {threshold}{aside}",
            frame.count(),
        )
    else:
        verdict = Verdict(OK, f"no flow suspended for more than {threshold}{aside}")
    return CheckResult("stuck_flows", "Stuck flows", frame, verdict, extras={"paused": held})
