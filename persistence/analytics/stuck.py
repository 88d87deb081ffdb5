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
    first_rows,
    is_analyzed,
    keep,
)
from persistence.analytics.evidence import known_flows
from persistence.analytics.session_columns import counterpart_flow
from persistence.analytics.waiting import RECEIVE, UNTIL, WAITS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

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
      node is not running it);
    * suspended on an external ``Operation``: running it (its checkpoint older than the
      threshold: the call has not come back), or backing off before a retry whose time
      passed more than the threshold ago.

    Flows in the hospital are left to :func:`failed_flows`; flows an operator paused
    (``node_paused_flows``) are not judged but listed in ``extras["paused"]``. ``warn`` when
    any is found. The findings are bounded: the counts are exact (one pass over the
    checkpoints, no join), the frame holds the ``report_rows`` longest waits with their
    counterparts, and the full list (every row joined with the counterparts) is computed
    only when written (``--findings-dir``).
    """
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    as_of = as_of_ms(snapshot, settings)
    limit = as_of - settings.stuck_after_ms
    paused = F.broadcast(
        snapshot.paused.select(
            F.col("node").alias("p_node"), F.col("flow_id").alias("p_flow"), "paused_at"
        )
    )
    live = snapshot.checkpoints.select(
        "node", "flow_id", "flow_class", "status", "suspended_on", WAITS, UNTIL, "updated_at"
    )
    held_columns = ["node", "flow_id", "flow_class", "status", "suspended_on", "paused_at"]
    checkpoints = live.where(F.col("status") != "HOSPITALIZED")
    if any(load.rows.get("paused", 1) for load in snapshot.nodes):
        on_hold = (live.node == paused.p_node) & (live.flow_id == paused.p_flow)
        checkpoints = checkpoints.join(paused, on_hold, "left_anti")
        held = keep(
            snapshot, live.join(paused, on_hold).select(*held_columns).orderBy("node", "flow_id")
        )
        on_pause = held.count()
    else:  # no flow paused: nothing to leave out, no join
        held = live.select(*held_columns[:-1], F.lit(None).cast("bigint").alias("paused_at"))
        held, on_pause = held.limit(0), 0
    branches = _stuck_branches(checkpoints, as_of, limit)
    base = _exploded(branches)
    order = [F.desc("waited_ms"), F.col("node"), F.col("flow_id")]
    rows, flows = _stuck_counts(checkpoints, limit)
    # the first rows lie among the rows of the first flows (every row of a flow sorts with
    # its flow, and a flow gives at least one row): the flows are ranked, then only those
    # are exploded into a row per session
    first_flows = keep(snapshot, first_rows(branches, order, settings.report_rows))
    top = keep(snapshot, first_rows(_exploded(first_flows), order, settings.report_rows))
    keys = top.where(F.col("session_id").isNotNull()).select(
        F.col("counterparty").alias("k_node"),
        counterpart_flow(F.col("node"), F.col("session_id")).alias("k_flow"),
    )
    # the counterparts of the rows kept only (a broadcast of their keys); of every row only
    # for the full list, when it is written
    wanted = known_flows(snapshot, only=keep(snapshot, keys))
    frame = keep(snapshot, _with_counterparts(snapshot, top, wanted).orderBy(*order))
    full = _with_counterparts(snapshot, base, known_flows(snapshot))
    threshold = duration(settings.stuck_after_ms)
    aside = f" ({on_pause} paused by an operator, not judged)" if on_pause else ""
    if flows:
        shown = f"; the {settings.report_rows} longest shown" if rows > settings.report_rows else ""
        verdict = Verdict(
            WARN,
            f"{flows} flow{'s' if flows != 1 else ''} stuck for more than {threshold}{aside}"
            f"{shown}",
            rows,
        )
    else:
        verdict = Verdict(OK, f"no flow suspended for more than {threshold}{aside}")
    return CheckResult(
        "stuck_flows",
        "Stuck flows",
        frame,
        verdict,
        extras={"paused": held},
        total=rows,
        full=full,
    )


def _stuck_counts(checkpoints: DataFrame, limit: int) -> tuple[int, int]:
    """(rows, flows) of :func:`_exploded` without making its rows: one pass, no explode.

    A flow waiting on a receive gives a row per session it waits on (the size of its
    ``waits``) and counts once if it has one; each other condition gives one row and one
    flow, as each is a branch of :func:`_stuck_branches`.
    """
    from pyspark.sql import functions as F

    conditions = _conditions(limit)
    sessions = _sessions()
    receiving = conditions.pop("receiving")
    rows = F.sum(F.when(receiving, sessions).otherwise(0))
    flows = F.count(F.when(receiving & (sessions > 0), True))
    for condition in conditions.values():
        rows = rows + F.count(F.when(condition, True))
        flows = flows + F.count(F.when(condition, True))
    counted = checkpoints.agg(rows.alias("rows"), flows.alias("flows")).first()
    if counted is None:
        return 0, 0
    return int(counted["rows"] or 0), int(counted["flows"] or 0)


def _conditions(limit: int) -> dict[str, Column]:
    """The stuck conditions of a checkpoint row, by name (:func:`_stuck_branches`'s branches)."""
    from pyspark.sql import functions as F

    until = F.col(UNTIL)
    return {
        "receiving": (F.col("suspended_on") == RECEIVE) & (F.col("updated_at") <= limit),
        "sleeping": (F.col("suspended_on") == "Sleep") & (until <= limit),
        "idle": F.col("status").isin("UNSTARTED", "RUNNABLE") & (F.col("updated_at") <= limit),
        "operating": (F.col("suspended_on") == "Operation")
        & (F.coalesce(until, F.col("updated_at")) <= limit),
    }


ROW_COLUMNS = ("node", "flow_id", "flow_class", "status", "suspended_on", "waited_ms")
"""The columns every stuck row starts with, whatever the flow waits on."""


def _stuck_branches(checkpoints: DataFrame, as_of: int, limit: int) -> DataFrame:
    """Every stuck flow, one row per condition it meets, before its sessions are exploded.

    :data:`ROW_COLUMNS`, and ``sessions`` and ``counterparties``: the sessions a flow waiting
    on a receive waits on (at least one) and their counterparties, null for the other
    conditions. Only those two fields of ``waits`` are read. No join, no shuffle.
    """
    from pyspark.sql import functions as F

    conditions = _conditions(limit)
    receiving = checkpoints.where(conditions["receiving"] & (_sessions() > 0)).select(
        *ROW_COLUMNS[:-1],
        (F.lit(as_of) - F.col("updated_at")).alias("waited_ms"),
        F.col(WAITS).getField("session").alias("sessions"),
        F.col(WAITS).getField("counterparty").alias("counterparties"),
    )
    until = F.col(UNTIL)
    sleeping = checkpoints.where(conditions["sleeping"])
    idle = checkpoints.where(conditions["idle"])
    # an external operation: since its retry time when backing off, else since the checkpoint
    operation_since = F.coalesce(until, F.col("updated_at"))
    operating = checkpoints.where(conditions["operating"])
    others = (
        sleeping.withColumn("waited_ms", F.lit(as_of) - until)
        .unionByName(idle.withColumn("waited_ms", F.lit(as_of) - F.col("updated_at")))
        .unionByName(operating.withColumn("waited_ms", F.lit(as_of) - operation_since))
    )
    none = F.lit(None).cast("array<string>")
    return receiving.unionByName(
        others.select(*ROW_COLUMNS, none.alias("sessions"), none.alias("counterparties"))
    )


def _sessions() -> Column:
    """How many sessions a checkpoint's ``waits`` holds (0 for none), reading one field only.

    (``size(waits)`` would make Spark read every field of every element.)
    """
    from pyspark.sql import functions as F

    sessions = F.col(WAITS).getField("session")
    return F.when(sessions.isNull(), F.lit(0)).otherwise(F.size(sessions))


def _exploded(branches: DataFrame) -> DataFrame:
    """The stuck rows of :func:`_stuck_branches`: one per session waited on, else one.

    ``first`` marks one row per flow (the first session a flow waits on; the only row of a
    sleeping or idle flow), so counting the flows needs no ``distinct``.
    """
    from pyspark.sql import functions as F

    rows = branches.select(
        *ROW_COLUMNS, "counterparties", F.posexplode_outer("sessions").alias("pos", "session_id")
    )
    return rows.select(
        *ROW_COLUMNS,
        "session_id",
        F.when(F.col("pos").isNotNull(), F.element_at("counterparties", F.col("pos") + 1)).alias(
            "counterparty"
        ),
        F.coalesce(F.col("pos") == 0, F.lit(True)).alias("first"),
    )


def _with_counterparts(snapshot: Snapshot, rows: DataFrame, known: DataFrame) -> DataFrame:
    """``rows`` of :func:`_exploded` with the counterpart flow and its status there."""
    from pyspark.sql import functions as F

    known = known.select(
        F.col("node").alias("k_node"),
        F.col("flow_id").alias("k_flow"),
        F.col("status").alias("counterpart_status"),
    )
    rows = rows.withColumn(
        "counterpart_flow_id",
        F.when(
            F.col("session_id").isNotNull(), counterpart_flow(F.col("node"), F.col("session_id"))
        ),
    )
    rows = rows.join(
        known,
        (known.k_node == rows.counterparty) & (known.k_flow == rows.counterpart_flow_id),
        "left",
    )
    analyzed = is_analyzed(snapshot, F.col("counterparty"))
    live_states = ("UNSTARTED", "RUNNABLE", "SUSPENDED", "HOSPITALIZED")
    waits_on = F.col("session_id").isNotNull()
    return rows.select(
        "node",
        "flow_id",
        "flow_class",
        "status",
        "suspended_on",
        "waited_ms",
        "session_id",
        "counterparty",
        "counterpart_flow_id",
        F.when(~waits_on, F.lit(None).cast("string"))
        .when(~analyzed, F.lit("not analyzed"))
        .when(F.col("counterpart_status").isNull(), F.lit("missing"))
        .otherwise(F.col("counterpart_status"))
        .alias("counterpart_status"),
        F.when(~waits_on | ~analyzed, F.lit(None).cast("boolean"))
        .otherwise(
            F.col("counterpart_status").isin(*live_states) & F.col("counterpart_status").isNotNull()
        )
        .alias("counterparty_has_session"),
    )
