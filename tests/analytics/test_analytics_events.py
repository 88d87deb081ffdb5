"""The event-log summary of benchmarks/analytics_events.py, on a log written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.analytics_events import (
    QUERY_END,
    QUERY_START,
    event_file,
    idle_ms,
    main,
    query_summary,
    read_events,
    summary,
)


def _stage(stage_id: int, run_ms: int, cpu_ns: int, rows: int) -> dict[str, object]:
    return {
        "Event": "SparkListenerStageCompleted",
        "Stage Info": {
            "Stage ID": stage_id,
            "Number of Tasks": stage_id + 2,
            "Accumulables": [
                {"Name": "internal.metrics.executorRunTime", "Value": run_ms},
                {"Name": "internal.metrics.executorCpuTime", "Value": cpu_ns},
                {"Name": "internal.metrics.input.recordsRead", "Value": rows},
            ],
        },
    }


EVENTS = [
    {"Event": "SparkListenerApplicationStart", "Timestamp": 1_000},
    {"Event": QUERY_START, "executionId": 0, "time": 5_500, "description": "count at s.py:10"},
    {
        "Event": "SparkListenerJobStart",
        "Job ID": 0,
        "Submission Time": 6_000,
        "Stage IDs": [0, 1],
        "Properties": {
            "callSite.short": "count at screening.py:10",
            "spark.sql.execution.id": "0",
            "fiberflow.analysis.step": "stuck_flows",
        },
    },
    _stage(0, 4_000, 3_000_000_000, 1_000_000),
    _stage(1, 1_000, 500_000_000, 0),
    {"Event": "SparkListenerJobEnd", "Job ID": 0, "Completion Time": 9_000},
    {"Event": QUERY_END, "executionId": 0, "time": 9_250},
    {"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": 11_000, "Stage IDs": [2, 3]},
    _stage(2, 200, 100_000_000, 50),
    {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": 11_500},
]


def _write(folder: Path, name: str = "events_1_local-1") -> Path:
    path = folder / "eventlog_v2_local-1" / name
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(json.dumps(event) for event in EVENTS) + "\n")
    return path


def test_jobs_stages_and_idle_time_are_read(tmp_path: Path) -> None:
    log = read_events(_write(tmp_path).read_text().splitlines())
    assert [job.job_id for job in log.jobs] == [0, 1]
    first, second = log.jobs
    assert first.call_site == "count at screening.py:10"
    assert [stage.run_ms for stage in log.job_stages(first)] == [4_000, 1_000]
    assert log.job_stages(second)[0].rows == 50  # stage 3 was skipped: no metrics
    assert idle_ms(log.jobs) == 2_000


def test_summary_lists_slow_jobs_and_totals(tmp_path: Path) -> None:
    lines = list(summary(read_events(_write(tmp_path).read_text().splitlines()), 1.0))
    assert len(lines) == 3  # header, job 0 (3 s), totals; job 1 took 0.5 s
    assert lines[1].split()[:6] == ["0", "5.0", "3.0", "5.0", "3.5", "1,000,000"]
    assert "2 jobs; tasks ran 5.2 s, 3.6 s of it on a CPU" in lines[2]
    assert "first job started 5.0 s" in lines[2] and "no job ran for 2.0 s" in lines[2]


def test_folder_is_searched_and_compressed_logs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    written = _write(tmp_path)
    assert event_file(tmp_path) == written
    assert main([str(tmp_path), "--min-seconds", "0", "--queries"]) == 0
    out = capsys.readouterr().out
    assert "count at screening.py:10" in out and "count at s.py:10" in out
    written.rename(written.with_suffix(".lz4"))
    assert main([str(tmp_path)]) == 2
    assert "compress=false" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing")]) == 2


def test_queries_gather_their_jobs_and_tasks(tmp_path: Path) -> None:
    log = read_events(_write(tmp_path).read_text().splitlines())
    assert [query.execution_id for query in log.queries] == [0]
    assert log.job_queries == {0: 0}  # job 1 ran outside any SQL query
    assert [job.step for job in log.jobs] == ["stuck_flows", ""]
    lines = list(query_summary(log))
    # query 0: started 4.5 s after the application, took 3.75 s, job 0 with stages 0 and 1
    assert lines[1].split()[:6] == ["0", "4.5", "3.75", "1", "5", "stuck_flows"]
    assert lines[1].endswith("count at s.py:10")
    assert lines[3].split() == ["stuck_flows", "1", "1", "5", "3.8"]  # the totals by step
    assert lines[4] == "1 SQL queries took 3.8 s; 1 of the 2 jobs ran for one"
    assert list(query_summary(read_events([])))[-1] == "no SQL queries"
