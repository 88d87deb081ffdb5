"""benchmarks/analytics_actions.py: each Spark action timed, with its cores and its caller."""

from __future__ import annotations

import os
import traceback

import pytest

from benchmarks.analytics_actions import (
    Action,
    Recorder,
    Sample,
    by_site,
    cores,
    cpu_at,
    main,
    report,
    site_of,
    tree_cpu_seconds,
)

THIS_FILE = "tests/analytics/test_analytics_actions.py"


def _frame(filename: str, line: int, name: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(filename, line, name, line="")


def test_an_action_is_named_by_the_innermost_line_of_the_analysis() -> None:
    frames = [
        _frame("/x/flows/cli.py", 10, "main"),
        _frame("/x/persistence/analytics/checks.py", 20, "run_checks"),
        _frame("/x/persistence/analytics/stuck.py", 117, "stuck_flows"),
        _frame("/x/pyspark/sql/classic/dataframe.py", 300, "collect"),
    ]
    assert site_of(frames) == "stuck.py:117:stuck_flows"
    assert site_of(frames[:1]) == "?"
    assert site_of(frames, under="flows/") == "cli.py:10:main"


def test_cores_are_the_cpu_used_over_the_wall_time_between_samples() -> None:
    samples = [Sample(0.0, 0.0), Sample(1.0, 1.5), Sample(2.0, 3.5), Sample(3.0, 4.0)]
    assert cpu_at(samples, -1.0) == 0.0
    assert cpu_at(samples, 1.5) == 1.5  # the latest sample at or before
    assert cpu_at(samples, 9.0) == 4.0
    assert cores(samples, 1.0, 2.0) == pytest.approx(2.0)
    assert cores(samples, 0.0, 3.0) == pytest.approx(4.0 / 3.0)
    assert cores(samples, 2.0, 2.0) == 0.0  # no span, no figure


def test_actions_are_summed_by_line_longest_first() -> None:
    actions = [
        Action(0.0, 1.0, "collect", "a.py:1:f"),
        Action(1.0, 4.0, "count", "b.py:2:g"),
        Action(4.0, 6.5, "collect", "a.py:1:f"),
    ]
    assert by_site(actions) == [("a.py:1:f", 2, 3.5), ("b.py:2:g", 1, 3.0)]
    recorder = Recorder()
    recorder.actions.extend(actions)
    recorder.samples.extend([Sample(0.0, 0.0), Sample(7.0, 12.0)])
    printed = report(recorder, min_seconds=2.0)
    assert "b.py:2:g" in printed.split("by line")[0]  # 3.0 s: shown in the run's order
    assert "3 actions (2 shown" in printed  # the first is under 2 s and after no gap
    assert "of a run of 7.0 s; CPU 12.0 s (1.71 cores)" in printed


def test_the_cpu_of_this_process_and_its_children_is_read_from_proc() -> None:
    first = tree_cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))  # some CPU of our own
    assert tree_cpu_seconds(os.getpid()) > first


def _two_actions(frame: object) -> tuple[int, object]:
    counted = frame.count()  # type: ignore[attr-defined]
    return counted, frame.first()  # type: ignore[attr-defined]


def test_spark_actions_are_timed_once_each_and_the_methods_restored(spark: object) -> None:
    from pyspark.sql import functions as F

    frame = spark.range(1000).select((F.col("id") * 2).alias("twice"))  # type: ignore[attr-defined]
    original = type(frame).count
    recorder = Recorder(under=THIS_FILE, sample_seconds=0.05)
    with recorder.recording():
        counted, first = _two_actions(frame)
    assert (counted, first["twice"]) == (1000, 0)  # type: ignore[index]
    # first() runs head(), which runs take(): one action, as the outer call
    assert [action.method for action in recorder.actions] == ["count", "first"]
    assert {action.site.rsplit(":", 1)[1] for action in recorder.actions} == {"_two_actions"}
    assert all(action.seconds > 0 for action in recorder.actions)
    assert type(frame).count is original  # unwrapped again
    assert len(recorder.samples) >= 2
    assert recorder.samples[-1].cpu >= recorder.samples[0].cpu


def test_the_command_must_be_an_analysis() -> None:
    with pytest.raises(SystemExit):
        main(["--", "ls", "-l"])
