"""What a checkpoint waits for, parsed once: the ``waits`` and ``until`` columns.

A checkpoint row says what its flow waits for in ``waiting_for``, a JSON text the node
writes (``persistence/sql_transaction.py``): a list of ``{"session", "counterparty"}`` for
a flow suspended on ``Receive``, an object with ``until`` (epoch milliseconds) for ``Sleep``
and for an ``Operation`` backing off. Several checks need it parsed, and parsing JSON is the
most expensive thing they would do per row (Spark's ``from_json`` runs at about 150,000 rows
a second per core). So it is parsed once, into two columns every checkpoints frame carries:

* :data:`WAITS`: ``array<struct<session: string, counterparty: string>>``, the sessions a
  flow suspended on ``Receive`` waits on (null for any other row);
* :data:`UNTIL`: ``bigint``, the ``until`` of any other row (null when absent).

The Parquet export (:mod:`persistence.analytics.export`) parses them in Python when it reads
a row, so they are stored beside the row and refreshed with it; a snapshot read over JDBC
or Arrow gets them from Spark (:func:`with_waits`) before it is cached, so once per row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame

WAITS = "waits"
"""The parsed sessions a ``Receive`` waits on: ``array<struct<session, counterparty>>``."""
UNTIL = "until"
"""The parsed ``until`` of a ``Sleep`` or ``Operation`` wait (epoch milliseconds)."""
RECEIVE = "Receive"
"""The ``suspended_on`` of a flow waiting for messages."""
WAITS_DDL = "array<struct<session:string,counterparty:string>>"
"""Spark's type of :data:`WAITS`."""
WAIT_SINCE = "wait_since"
"""Since when (epoch ms) a flow has waited on what it is suspended on, for the stuck check:
the checkpoint's ``updated_at`` for a ``Receive`` of at least one session, the ``until`` of
a ``Sleep``, the ``until`` (else ``updated_at``) of an ``Operation``; null for anything else,
and for a flow in the hospital or of no status."""
WAIT_ROWS = "wait_rows"
"""The stuck check's rows for that wait: the sessions a ``Receive`` waits on, else 1."""
IDLE_SINCE = "idle_since"
"""Since when an ``UNSTARTED`` or ``RUNNABLE`` flow has had no checkpoint (its
``updated_at``); null for any other status."""
STUCK_COLUMNS = (WAIT_SINCE, WAIT_ROWS, IDLE_SINCE)
"""What the stuck check ranks a checkpoint by: two times and a count, derived once per row
(:func:`with_stuck_columns`, :func:`arrow_stuck_columns`), so that its scan of every
checkpoint reads three numbers instead of the status strings and the ``waits`` arrays."""
IDLE_STATES = ("UNSTARTED", "RUNNABLE")
"""Statuses of a flow that should be running: stuck when it has no checkpoint for long."""


def with_waits(checkpoints: DataFrame) -> DataFrame:
    """``checkpoints`` with :data:`WAITS` and :data:`UNTIL` parsed from ``waiting_for``.

    A frame that already has them (a Parquet export made by this version) is returned as is.
    """
    from pyspark.sql import functions as F

    if WAITS in checkpoints.columns and UNTIL in checkpoints.columns:
        return checkpoints
    receiving = F.col("suspended_on") == RECEIVE
    return checkpoints.withColumns(
        {
            WAITS: F.when(receiving, F.from_json("waiting_for", WAITS_DDL)),
            UNTIL: F.when(~receiving, F.get_json_object("waiting_for", "$.until").cast("bigint")),
        }
    )


def with_stuck_columns(checkpoints: DataFrame) -> DataFrame:
    """``checkpoints`` (with :data:`WAITS` and :data:`UNTIL`) and :data:`STUCK_COLUMNS`.

    A frame that already has them (a Parquet export made by this version) is returned as is.
    """
    from pyspark.sql import functions as F

    if all(name in checkpoints.columns for name in STUCK_COLUMNS):
        return checkpoints
    status, on, updated, until = (
        F.col("status"),
        F.col("suspended_on"),
        F.col("updated_at"),
        F.col(UNTIL),
    )
    none = F.lit(None).cast("bigint")
    hospital = status.isNull() | (status == "HOSPITALIZED")
    sessions = F.when(F.col(WAITS).isNull(), F.lit(0)).otherwise(F.size(F.col(WAITS)))
    return checkpoints.withColumns(
        {
            WAIT_SINCE: F.when(hospital, none)
            .when((on == RECEIVE) & (sessions > 0), updated)
            .when(on == "Sleep", until)
            .when(on == "Operation", F.coalesce(until, updated)),
            WAIT_ROWS: F.when(on == RECEIVE, sessions).otherwise(F.lit(1)).cast("int"),
            IDLE_SINCE: F.when(hospital, none).when(status.isin(*IDLE_STATES), updated),
        }
    )


def stuck_values(
    status: str | None,
    suspended_on: str | None,
    updated_at: int | None,
    sessions: int,
    until: int | None,
) -> tuple[int | None, int, int | None]:
    """A checkpoint row's :data:`STUCK_COLUMNS`, in Python (as :func:`with_stuck_columns`).

    ``sessions``: how many sessions its :data:`WAITS` holds (0 when null).
    """
    rows = sessions if suspended_on == RECEIVE else 1
    if status is None or status == "HOSPITALIZED":
        return None, rows, None
    since: int | None = None
    if suspended_on == RECEIVE and sessions > 0:
        since = updated_at
    elif suspended_on == "Sleep":
        since = until
    elif suspended_on == "Operation":
        since = until if until is not None else updated_at
    return since, rows, updated_at if status in IDLE_STATES else None


def arrow_stuck_columns(
    status: Sequence[str | None],
    suspended_on: Sequence[str | None],
    updated_at: Sequence[int | None],
    waits: pyarrow.Array,
    until: pyarrow.Array,
) -> list[pyarrow.Array]:
    """The :data:`STUCK_COLUMNS` arrays of rows whose :func:`arrow_waits` gave ``waits``, ``until``.

    As :func:`with_stuck_columns` derives them in Spark (:func:`stuck_values` a row).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    sessions = pc.fill_null(pc.list_value_length(waits), 0).to_pylist()
    values = [
        stuck_values(*row)
        for row in zip(status, suspended_on, updated_at, sessions, until.to_pylist(), strict=True)
    ]
    since, rows, idle = zip(*values, strict=True) if values else ((), (), ())
    return [
        pa.array(since, type=pa.int64()),
        pa.array(rows, type=pa.int32()),
        pa.array(idle, type=pa.int64()),
    ]


def arrow_waits(
    suspended_on: Sequence[str | None],
    waiting_for: Sequence[str | None],
    node: str | None = None,
    flow_ids: Sequence[str | None] | None = None,
) -> tuple[pyarrow.Array, pyarrow.Array]:
    """The :data:`WAITS` and :data:`UNTIL` arrays of rows, parsed in Python (the export).

    Parses as :func:`with_waits` does: text that is not the JSON expected gives nulls (a
    ``Receive`` list element without a field gives a null field), never an error. Each wait
    also carries its session keys (:mod:`persistence.analytics.session_flows`) when the
    node's name and the rows' ``flow_ids`` are given, else nulls (Spark computes them).
    """
    import pyarrow as pa

    from persistence.analytics.session_flows import python_session_keys

    waits: list[list[dict[str, Any] | None] | None] = []
    until: list[int | None] = []
    flows = flow_ids if flow_ids is not None else [None] * len(suspended_on)
    for kind, text, flow in zip(suspended_on, waiting_for, flows, strict=True):
        value = _parsed(text)
        if kind == RECEIVE:
            sessions = _sessions(value)
            if sessions is not None and node is not None and flow is not None:
                for item in sessions:
                    if item is not None:
                        keys = python_session_keys(
                            node, item["session"], item["counterparty"], flow
                        )
                        if keys is not None:
                            item.update(keys)
            waits.append(sessions)
            until.append(None)
        else:
            waits.append(None)
            until.append(_until(value))
    return pa.array(waits, type=arrow_waits_type()), pa.array(until, type=pa.int64())


def arrow_waits_type() -> pyarrow.DataType:
    """The Arrow type of :data:`WAITS` in the export.

    The session, the counterparty and the session keys
    (:data:`~persistence.analytics.session_flows.SESSION_KEY_TYPES`).
    """
    import pyarrow as pa

    from persistence.analytics.session_flows import SESSION_KEY_TYPES

    keys = [
        (name, pa.bool_() if kind == "boolean" else pa.int64())
        for name, kind in SESSION_KEY_TYPES.items()
    ]
    return pa.list_(pa.struct([("session", pa.string()), ("counterparty", pa.string()), *keys]))


def _parsed(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _sessions(value: Any) -> list[dict[str, Any] | None] | None:
    if not isinstance(value, list):
        return None
    return [
        {"session": _text(item.get("session")), "counterparty": _text(item.get("counterparty"))}
        if isinstance(item, dict)
        else None
        for item in value
    ]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def _until(value: Any) -> int | None:
    if not isinstance(value, dict):
        return None
    until = value.get("until")
    if isinstance(until, bool) or not isinstance(until, int | float | str):
        return None
    try:
        return int(until)
    except ValueError:
        return None
