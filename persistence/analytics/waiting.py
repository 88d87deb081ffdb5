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
"""What the stuck check ranks a checkpoint by: two times and a count
(:func:`with_stuck_columns`)."""
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
    """``checkpoints`` (with :data:`WAITS` and :data:`UNTIL`) and :data:`STUCK_COLUMNS`."""
    from pyspark.sql import functions as F

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


def arrow_waits(
    suspended_on: Sequence[str | None], waiting_for: Sequence[str | None]
) -> tuple[pyarrow.Array, pyarrow.Array]:
    """The :data:`WAITS` and :data:`UNTIL` arrays of rows, parsed in Python (the export).

    Parses as :func:`with_waits` does: text that is not the JSON expected gives nulls (a
    ``Receive`` list element without a field gives a null field), never an error.
    """
    import pyarrow as pa

    waits: list[list[dict[str, Any] | None] | None] = []
    until: list[int | None] = []
    for kind, text in zip(suspended_on, waiting_for, strict=True):
        value = _parsed(text)
        waits.append(_sessions(value) if kind == RECEIVE else None)
        until.append(None if kind == RECEIVE else _until(value))
    return pa.array(waits, type=arrow_waits_type()), pa.array(until, type=pa.int64())


def arrow_waits_type() -> pyarrow.DataType:
    """The Arrow type of :data:`WAITS` in the export."""
    import pyarrow as pa

    return pa.list_(pa.struct([("session", pa.string()), ("counterparty", pa.string())]))


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
