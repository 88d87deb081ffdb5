"""The parsed waits: the export's Python parse and Spark's agree on every kind of row."""

from __future__ import annotations

import json

import pytest

from persistence.analytics.waiting import UNTIL, WAITS, arrow_waits, with_waits

ROWS = [
    ("Receive", json.dumps([{"session": "F.s0", "counterparty": "O=Bob,L=Paris,C=FR"}])),
    (
        "Receive",
        json.dumps(
            [
                {"session": "F.s0", "counterparty": "O=Bob,L=Paris,C=FR"},
                {"session": "F.s1", "counterparty": None},
            ]
        ),
    ),
    ("Receive", "[]"),
    ("Receive", "not json"),
    ("Receive", None),
    ("Sleep", json.dumps({"until": 1_800_000_000_123})),
    (
        "Operation",
        json.dumps(
            {"operation": "http", "label": "x", "attempt": 2, "state": "running", "until": None}
        ),
    ),
    ("Operation", json.dumps({"state": "backing off", "until": 1_800_000_000_999})),
    ("Sleep", "{broken"),
    (None, None),
]


@pytest.mark.spark
def test_the_export_parses_waits_as_spark_does(spark) -> None:
    """Every row gives the same ``waits`` and ``until`` whether Python or Spark parses it."""
    frame = spark.createDataFrame(  # type: ignore[attr-defined]
        [(i, kind, text) for i, (kind, text) in enumerate(ROWS)],
        "i int, suspended_on string, waiting_for string",
    )
    parsed = with_waits(frame).orderBy("i").collect()
    from_spark = [
        (
            None
            if row[WAITS] is None
            else [None if w is None else (w["session"], w["counterparty"]) for w in row[WAITS]],
            row[UNTIL],
        )
        for row in parsed
    ]
    waits, until = arrow_waits([k for k, _ in ROWS], [t for _, t in ROWS])
    from_python = [
        (
            None
            if w is None
            else [None if item is None else (item["session"], item["counterparty"]) for item in w],
            u,
        )
        for w, u in zip(waits.to_pylist(), until.to_pylist(), strict=True)
    ]
    assert from_python == from_spark
    assert from_python[0] == ([("F.s0", "O=Bob,L=Paris,C=FR")], None)
    assert from_python[5] == (None, 1_800_000_000_123)
    assert from_python[7] == (None, 1_800_000_000_999)


@pytest.mark.spark
def test_a_frame_that_carries_the_parsed_waits_is_left_alone(spark) -> None:
    """A frame read from an export already has the columns: nothing is parsed again."""
    frame = spark.createDataFrame(  # type: ignore[attr-defined]
        [("Sleep", "{}", None, 5)],
        f"suspended_on string, waiting_for string, {WAITS} "
        "array<struct<session:string,counterparty:string>>, until bigint",
    )
    assert with_waits(frame) is frame


STUCK_ROWS = [  # status, suspended_on, updated_at, waiting_for
    ("SUSPENDED", "Receive", 100, json.dumps([{"session": "F.s0", "counterparty": "B"}] * 2)),
    ("SUSPENDED", "Receive", 101, "[]"),
    ("SUSPENDED", "Receive", 102, "not json"),
    ("HOSPITALIZED", "Receive", 103, json.dumps([{"session": "F.s0", "counterparty": "B"}])),
    (None, "Sleep", 104, json.dumps({"until": 5})),
    ("SUSPENDED", "Sleep", 105, json.dumps({"until": 6})),
    ("SUSPENDED", "Sleep", 106, "{}"),
    ("SUSPENDED", "Operation", 107, json.dumps({"state": "running", "until": None})),
    ("SUSPENDED", "Operation", 108, json.dumps({"state": "backing off", "until": 9})),
    ("RUNNABLE", "Receive", 109, json.dumps([{"session": "F.s1", "counterparty": "B"}])),
    ("UNSTARTED", None, 110, None),
    ("RUNNABLE", None, None, None),
    ("COMPLETED", None, 111, None),
]
"""Checkpoint rows of every kind the stuck check tells apart, odd ones included."""


@pytest.mark.spark
def test_spark_derives_the_stuck_columns(spark) -> None:
    """Each row's stuck times and rows, as the stuck check ranks them."""
    from persistence.analytics.waiting import STUCK_COLUMNS, with_stuck_columns

    frame = spark.createDataFrame(  # type: ignore[attr-defined]
        [(i, *row) for i, row in enumerate(STUCK_ROWS)],
        "i int, status string, suspended_on string, updated_at bigint, waiting_for string",
    )
    derived = with_stuck_columns(with_waits(frame)).orderBy("i").collect()
    from_spark = [tuple(row[name] for name in STUCK_COLUMNS) for row in derived]
    assert from_spark[:4] == [(100, 2, None), (None, 0, None), (None, 0, None), (None, 1, None)]
    assert from_spark[4:9] == [
        (None, 1, None),
        (6, 1, None),
        (None, 1, None),
        (107, 1, None),
        (9, 1, None),
    ]
    assert from_spark[9:] == [(109, 1, 109), (None, 1, 110), (None, 1, None), (None, 1, None)]
