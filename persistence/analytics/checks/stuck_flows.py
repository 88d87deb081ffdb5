"""The stuck-flow check: flows suspended for longer than ``stuck_after_ms`` (``warn``).

A flow waiting on a receive is shown with the flow that should hold the other end of each
session it waits on, and that flow's status on the counterparty's node, so an operator sees
at once whether the peer is gone, finished or waiting too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from persistence.analytics.check_results import (
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
    keep_in_order,
)
from persistence.analytics.evidence import known_flows
from persistence.analytics.session_columns import counterpart_flow
from persistence.analytics.waiting import (
    IDLE_SINCE,
    RECEIVE,
    STUCK_COLUMNS,
    UNTIL,
    WAIT_ROWS,
    WAIT_SINCE,
    WAITS,
    with_stuck_columns,
)

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
    any is found. The findings are bounded: the counts are exact (observed in the pass
    over every checkpoint's :data:`~persistence.analytics.waiting.STUCK_COLUMNS` that
    finds the longest waits, no join), the frame holds the
    ``report_rows`` longest waits with their counterparts, and the full list (every row
    joined with the counterparts) is computed only when written (``--findings-dir``).
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    settings = settings or CheckSettings()
    as_of = as_of_ms(snapshot, settings)
    limit = as_of - settings.stuck_after_ms
    paused = F.broadcast(
        snapshot.paused.select(
            F.col("node").alias("p_node"), F.col("flow_id").alias("p_flow"), "paused_at"
        )
    )
    live = with_stuck_columns(snapshot.checkpoints).select(
        "node",
        "flow_id",
        "flow_class",
        "status",
        "suspended_on",
        WAITS,
        UNTIL,
        "updated_at",
        *STUCK_COLUMNS,
    )
    held_columns = ["node", "flow_id", "flow_class", "status", "suspended_on", "paused_at"]
    checkpoints = live  # (a flow in the hospital has no stuck time: see waiting.py)
    if any(load.rows.get("paused", 1) for load in snapshot.nodes):
        on_hold = (live.node == paused.p_node) & (live.flow_id == paused.p_flow)
        checkpoints = checkpoints.join(paused, on_hold, "left_anti")
        held = keep_in_order(
            snapshot, live.join(paused, on_hold).select(*held_columns), "node", "flow_id"
        )
        on_pause = held.count()
    else:  # no flow paused: nothing to leave out, no join
        held = live.select(*held_columns[:-1], F.lit(None).cast("bigint").alias("paused_at"))
        held, on_pause = held.limit(0), 0
    order = [F.desc("waited_ms"), F.col("node"), F.col("flow_id")]
    # The first rows lie among the rows of the first flows ranked by their longest wait (a
    # flow's rows sort with it, and a flow gives at least one row). A flow's longest wait
    # began at the least of its two stuck times (each compared with the same limit), so
    # one scan of those two numbers (and the rows a wait gives) finds when the
    # report_rows-th longest wait began and counts every stuck row and flow on the way
    # (observed: no pass of its own); a second reads the few flows that waited at least as
    # long, whole, ranks them by the full order (ties by node and flow id) and keeps the
    # first. The first reads no status string or `waits` array; the second asks for the few
    # flows in a form Parquet can judge from its statistics (:func:`_began_by`), so it
    # skips what cannot hold them instead of decoding every column of every row.
    since = F.least(F.col(WAIT_SINCE), F.col(IDLE_SINCE))
    counts = Observation("stuck counts")
    observed = checkpoints.select(WAIT_SINCE, WAIT_ROWS, IDLE_SINCE).observe(
        counts, *_stuck_counts(limit)
    )
    ranked = first_rows(
        observed.where(since <= limit).select(since.alias("since")), ["since"], settings.report_rows
    )
    latest = max((row["since"] for row in ranked.collect()), default=None)
    counted = counts.get
    rows, flows = int(counted.get("rows") or 0), int(counted.get("flows") or 0)
    in_play = checkpoints.where(F.col("status") != "HOSPITALIZED")
    base = _exploded(_stuck_branches(_slim(in_play), as_of, limit))
    longest = _slim(in_play.where(_began_by(limit if latest is None else latest)))
    if latest is None:
        longest = longest.limit(0)
    # Both small frames are made at once (checkpointed): the counterparts' lookup below
    # broadcasts them into a join with each table, and a lazily cached frame would be
    # computed by each of those broadcasts side by side (a scan each).
    first_flows = first_rows(_stuck_flows(longest, as_of, limit), order, settings.report_rows)
    first_flows = first_flows.drop("waited_ms").localCheckpoint(eager=True)
    top = first_rows(
        _exploded(_stuck_branches(first_flows, as_of, limit)), order, settings.report_rows
    ).localCheckpoint(eager=True)
    keys = top.where(F.col("session_id").isNotNull()).select(
        F.col("counterparty").alias("k_node"),
        counterpart_flow(F.col("node"), F.col("session_id")).alias("k_flow"),
    )
    # the counterparts of the rows kept only (a broadcast of their keys); of every row only
    # for the full list, when it is written
    wanted = known_flows(snapshot, only=keep(snapshot, keys))
    frame = keep_in_order(snapshot, _with_counterparts(snapshot, top, wanted), *order)

    def full() -> DataFrame:
        # built only when written (--findings-dir): every known flow's status is a query of
        # its own (the status pairs of all checkpoints), not to be paid for the report
        return _with_counterparts(snapshot, base, known_flows(snapshot))

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


def _stuck_counts(limit: int) -> tuple[Column, Column]:
    """(rows, flows) of :func:`_exploded`, from the :data:`STUCK_COLUMNS` of every row.

    A flow waiting on a receive gives a row per session it waits on (its ``wait_rows``) and
    counts once; a sleep, an external operation and a flow that should be running give one
    row and one flow each, as each is a branch of :func:`_stuck_branches`.
    """
    from pyspark.sql import functions as F

    waiting = F.col(WAIT_SINCE) <= limit
    idle = F.col(IDLE_SINCE) <= limit
    rows = F.sum(F.when(waiting, F.col(WAIT_ROWS)).otherwise(0)) + F.count(F.when(idle, True))
    flows = F.count(F.when(waiting, True)) + F.count(F.when(idle, True))
    return rows.alias("rows"), flows.alias("flows")


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


def _began_by(bound: int) -> Column:
    """A checkpoint's longest wait began at or before ``bound``: ``least(wait, idle) <= bound``.

    Written as a disjunction of the two stored times so that Spark hands it to the Parquet
    reader (a ``least`` it would not), which then skips every row group (and page, where the
    file has a page index) whose statistics show no time that early: the second pass of the
    stuck ranking reads the few flows it wants, not every column of every checkpoint. The
    same rows as ``least``: it ignores a null time, and a null comparison is not true.
    """
    from pyspark.sql import functions as F

    return (F.col(WAIT_SINCE) <= bound) | (F.col(IDLE_SINCE) <= bound)


def _slim(checkpoints: DataFrame) -> DataFrame:
    """The checkpoint columns the stuck rules read; of ``waits`` only two fields.

    ``all_sessions`` and ``all_counterparties``: the sessions a flow waits on and their
    counterparties (``size(waits)`` or the whole ``waits`` would make Spark read every field
    of every element).
    """
    from pyspark.sql import functions as F

    return checkpoints.select(
        "node",
        "flow_id",
        "flow_class",
        "status",
        "suspended_on",
        "updated_at",
        UNTIL,
        F.col(WAITS).getField("session").alias("all_sessions"),
        F.col(WAITS).getField("counterparty").alias("all_counterparties"),
    )


def _met(limit: int, as_of: int) -> list[tuple[Column, Column, bool]]:
    """Each stuck condition of a :func:`_slim` row: (met, waited ms, waits on a receive)."""
    from pyspark.sql import functions as F

    conditions = _conditions(limit)
    updated, until = F.col("updated_at"), F.col(UNTIL)
    met = [
        (conditions["receiving"] & (_sessions() > 0), updated, True),
        (conditions["sleeping"], until, False),
        (conditions["idle"], updated, False),
        # an external operation: since its retry time when backing off, else since the
        # checkpoint
        (conditions["operating"], F.coalesce(until, updated), False),
    ]
    return [(condition, F.lit(as_of) - since, receives) for condition, since, receives in met]


def _stuck_flows(checkpoints: DataFrame, as_of: int, limit: int) -> DataFrame:
    """Each stuck flow once: its :func:`_slim` row and its longest wait (``waited_ms``)."""
    from pyspark.sql import functions as F

    met = _met(limit, as_of)
    any_met = met[0][0]
    for condition, _, _ in met[1:]:
        any_met = any_met | condition
    longest = F.greatest(*[F.when(condition, waited) for condition, waited, _ in met])
    return checkpoints.where(any_met).withColumn("waited_ms", longest)


def _stuck_branches(checkpoints: DataFrame, as_of: int, limit: int) -> DataFrame:
    """Every stuck flow of :func:`_slim` rows, one row per condition it meets.

    :data:`ROW_COLUMNS`, and ``sessions`` and ``counterparties``: the sessions a flow waiting
    on a receive waits on (at least one) and their counterparties, null for the other
    conditions. One scan (each row's conditions met, exploded); no join, no shuffle.
    """
    from pyspark.sql import functions as F

    met = _met(limit, as_of)
    branches = F.array(
        *[
            F.struct(
                condition.alias("met"), waited.alias("waited_ms"), F.lit(receives).alias("receives")
            )
            for condition, waited, receives in met
        ]
    )
    any_met = met[0][0]
    for condition, _, _ in met[1:]:
        any_met = any_met | condition
    rows = checkpoints.where(any_met).select(
        *ROW_COLUMNS[:-1],
        "all_sessions",
        "all_counterparties",
        F.explode(F.filter(branches, lambda branch: branch["met"])).alias("branch"),
    )
    receives = F.col("branch.receives")
    return rows.select(
        *ROW_COLUMNS[:-1],
        F.col("branch.waited_ms").alias("waited_ms"),
        F.when(receives, F.col("all_sessions")).alias("sessions"),
        F.when(receives, F.col("all_counterparties")).alias("counterparties"),
    )


def _sessions() -> Column:
    """How many sessions a :func:`_slim` row waits on (0 for none)."""
    from pyspark.sql import functions as F

    sessions = F.col("all_sessions")
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
