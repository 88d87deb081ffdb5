"""What a cold analysis spends its time on, job by job: a summary of Spark's event log.

Run an analysis with Spark's event log on (``fiberflow analyze ... --conf
spark.eventLog.enabled=true --conf spark.eventLog.dir=DIR --conf
spark.eventLog.compress=false``), then ``python benchmarks/analytics_events.py DIR`` (the
folder Spark wrote, or the log file in it). It prints:

* each job that took at least ``--min-seconds`` (default 1): when it started, counted from the
  application's start, how long it took, the time its tasks ran and the part of it they
  were on a CPU (on two cores, tasks that ran much longer than their CPU time waited for a
  core: the JIT and the driver had it), the input rows its stages read and the line of the
  analysis that ran it (Spark's call site, when the driver named one);
* the totals: jobs, task time and task CPU, when the first job started (Spark's start-up
  and the snapshot's load before it) and how long no job ran between the first start and
  the last end (the driver planning, generating and compiling code, collecting results);
* with ``--queries``, each SQL query the analysis ran (an action: a ``count``, a
  ``collect``, a ``localCheckpoint``): when it started, how long it took, its jobs and tasks,
  the step of the analysis it ran for (``load``, a check's name, ``report``: the
  ``fiberflow.analysis.step`` property ``fiberflow analyze`` gives its jobs) and its call
  site, then the totals by step and of all the queries. On a small export nearly all of a run's time
  is these queries' own cost, whatever the rows (docs/analytics.md, *Benchmark*).

The figures of docs/analytics.md's *Benchmark* sections that name jobs (the screening's
grouping, the stuck ranking) come from this summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

RUN_TIME = "internal.metrics.executorRunTime"
"""The accumulator of a stage's task run time (milliseconds)."""
CPU_TIME = "internal.metrics.executorCpuTime"
"""The accumulator of a stage's task CPU time (nanoseconds)."""
ROWS_READ = "internal.metrics.input.recordsRead"
"""The accumulator of the rows a stage's tasks read from their input."""
STEP = "fiberflow.analysis.step"
"""The job property naming the step of the analysis (``persistence.analytics.running``)."""
EXECUTION_ID = "spark.sql.execution.id"
"""The job property naming the SQL query (execution) a job ran for."""
QUERY_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
"""The event of a SQL query's start."""
QUERY_END = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"
"""The event of a SQL query's end."""
COMPRESSED = (".lz4", ".lzf", ".snappy", ".zstd")
"""Suffixes of the compressed event logs Spark writes (this summary reads plain ones)."""


@attrs.frozen
class Stage:
    """A completed stage: its task run time, task CPU time and input rows."""

    run_ms: int
    cpu_ms: float
    rows: int


@attrs.frozen
class Job:
    """A job: its id, start and end (epoch ms), stages, and the call site that ran it."""

    job_id: int
    started_ms: int
    ended_ms: int
    stage_ids: tuple[int, ...]
    call_site: str
    step: str = ""
    """The step of the analysis the job ran for (:data:`STEP`), or empty."""


@attrs.frozen
class Query:
    """A SQL query (one action): its id, start and end (epoch ms) and its description."""

    execution_id: int
    started_ms: int
    ended_ms: int
    description: str


@attrs.frozen
class EventLog:
    """What :func:`read_events` keeps of an event log."""

    app_started_ms: int
    jobs: tuple[Job, ...]
    stages: dict[int, Stage]
    queries: tuple[Query, ...] = ()
    job_queries: dict[int, int] = attrs.field(factory=dict)
    """The SQL query each job ran for (job id to execution id), for jobs run by one."""
    stage_tasks: dict[int, int] = attrs.field(factory=dict)
    """The tasks each completed stage ran."""

    def job_stages(self, job: Job) -> list[Stage]:
        """The completed stages of ``job`` (skipped stages have no metrics)."""
        return [self.stages[stage] for stage in job.stage_ids if stage in self.stages]


def _accumulables(info: dict[str, Any]) -> dict[str, Any]:
    return {item.get("Name"): item.get("Value") for item in info.get("Accumulables", [])}


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def read_events(lines: Iterable[str]) -> EventLog:
    """The jobs and stages of an uncompressed event log (one JSON event a line)."""
    app_started = 0
    starts: dict[int, tuple[int, tuple[int, ...], str, str]] = {}
    ends: dict[int, int] = {}
    stages: dict[int, Stage] = {}
    query_starts: dict[int, tuple[int, str]] = {}
    query_ends: dict[int, int] = {}
    job_queries: dict[int, int] = {}
    stage_tasks: dict[int, int] = {}
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        kind = event.get("Event")
        if kind == "SparkListenerApplicationStart":
            app_started = int(event["Timestamp"])
        elif kind == "SparkListenerJobStart":
            properties = event.get("Properties") or {}
            starts[int(event["Job ID"])] = (
                int(event["Submission Time"]),
                tuple(int(stage) for stage in event["Stage IDs"]),
                str(properties.get("callSite.short", "")),
                str(properties.get(STEP) or ""),
            )
            if properties.get(EXECUTION_ID) is not None:
                job_queries[int(event["Job ID"])] = int(properties[EXECUTION_ID])
        elif kind == "SparkListenerJobEnd":
            ends[int(event["Job ID"])] = int(event["Completion Time"])
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            values = _accumulables(info)
            stages[int(info["Stage ID"])] = Stage(
                run_ms=int(_number(values.get(RUN_TIME))),
                cpu_ms=_number(values.get(CPU_TIME)) / 1e6,
                rows=int(_number(values.get(ROWS_READ))),
            )
            stage_tasks[int(info["Stage ID"])] = int(info.get("Number of Tasks", 0))
        elif kind == QUERY_START:
            query_starts[int(event["executionId"])] = (
                int(event["time"]),
                str(event.get("description", "")),
            )
        elif kind == QUERY_END:
            query_ends[int(event["executionId"])] = int(event["time"])
    queries = tuple(
        Query(execution, started, query_ends.get(execution, started), description)
        for execution, (started, description) in sorted(query_starts.items())
    )
    jobs = tuple(
        Job(job_id, started, ends.get(job_id, started), stage_ids, call_site, step)
        for job_id, (started, stage_ids, call_site, step) in sorted(starts.items())
    )
    return EventLog(
        app_started_ms=app_started,
        jobs=jobs,
        stages=stages,
        queries=queries,
        job_queries=job_queries,
        stage_tasks=stage_tasks,
    )


def idle_ms(jobs: Iterable[Job]) -> int:
    """Milliseconds between the first job's start and the last one's end with no job running."""
    spans = sorted((job.started_ms, job.ended_ms) for job in jobs)
    if not spans:
        return 0
    idle, reached = 0, spans[0][1]
    for started, ended in spans[1:]:
        if started > reached:
            idle += started - reached
        reached = max(reached, ended)
    return idle


def event_file(path: Path) -> Path:
    """The event log at ``path``: the file itself, or the one log in a folder (or its newest)."""
    if path.is_file():
        return path
    if path.is_dir():
        candidates = sorted(
            (item for item in path.rglob("*") if item.is_file() and "events" in item.name),
            key=lambda item: item.stat().st_mtime,
        )
        if not candidates:
            candidates = sorted(
                (item for item in path.iterdir() if item.is_file()),
                key=lambda item: item.stat().st_mtime,
            )
        if candidates:
            return candidates[-1]
    raise FileNotFoundError(f"no Spark event log at {path}")


def summary(log: EventLog, min_seconds: float) -> Iterator[str]:
    """The lines :func:`main` prints."""
    yield f"{'job':>5} {'start s':>8} {'took s':>7} {'tasks s':>8} {'cpu s':>6} {'rows':>11}  call"
    total_run = total_cpu = 0.0
    for job in log.jobs:
        stages = log.job_stages(job)
        run = sum(stage.run_ms for stage in stages) / 1000
        cpu = sum(stage.cpu_ms for stage in stages) / 1000
        total_run += run
        total_cpu += cpu
        took = (job.ended_ms - job.started_ms) / 1000
        if took >= min_seconds:
            rows = sum(stage.rows for stage in stages)
            start = (job.started_ms - log.app_started_ms) / 1000
            yield (
                f"{job.job_id:>5} {start:>8.1f} {took:>7.1f} {run:>8.1f} {cpu:>6.1f} "
                f"{rows:>11,}  {job.call_site}"
            )
    if not log.jobs:
        yield "no jobs"
        return
    first = (min(job.started_ms for job in log.jobs) - log.app_started_ms) / 1000
    last = (max(job.ended_ms for job in log.jobs) - log.app_started_ms) / 1000
    yield (
        f"{len(log.jobs)} jobs; tasks ran {total_run:.1f} s, {total_cpu:.1f} s of it on a CPU; "
        f"the first job started {first:.1f} s after the application, the last ended at "
        f"{last:.1f} s; no job ran for {idle_ms(log.jobs) / 1000:.1f} s in between"
    )


def query_summary(log: EventLog) -> Iterator[str]:
    """The lines ``--queries`` adds: every SQL query, the totals by step, then of all."""
    jobs: dict[int, list[Job]] = {}
    for job in log.jobs:
        if job.job_id in log.job_queries:
            jobs.setdefault(log.job_queries[job.job_id], []).append(job)
    header = f"{'query':>5} {'start s':>8} {'took s':>7} {'jobs':>5} {'tasks':>6}"
    yield f"{header}  {'step':<20} description"
    by_step: dict[str, list[float]] = {}
    total = 0.0
    for query in log.queries:
        took = (query.ended_ms - query.started_ms) / 1000
        total += took
        ran = jobs.get(query.execution_id, [])
        tasks = sum(log.stage_tasks.get(stage, 0) for job in ran for stage in job.stage_ids)
        step = next((job.step for job in ran if job.step), "-")
        sums = by_step.setdefault(step, [0.0, 0.0, 0.0, 0.0])
        sums[0] += 1
        sums[1] += len(ran)
        sums[2] += tasks
        sums[3] += took
        start = (query.started_ms - log.app_started_ms) / 1000
        yield (
            f"{query.execution_id:>5} {start:>8.1f} {took:>7.2f} {len(ran):>5} {tasks:>6}  "
            f"{step:<20} {query.description}"
        )
    if not log.queries:
        yield "no SQL queries"
        return
    yield f"{'step':<20} {'queries':>7} {'jobs':>5} {'tasks':>6} {'took s':>7}"
    for step, (queries, step_jobs, step_tasks, step_took) in by_step.items():
        yield (f"{step:<20} {queries:>7.0f} {step_jobs:>5.0f} {step_tasks:>6.0f} {step_took:>7.1f}")
    yield (
        f"{len(log.queries)} SQL queries took {total:.1f} s; "
        f"{sum(len(ran) for ran in jobs.values())} of the {len(log.jobs)} jobs ran for one"
    )


def main(argv: list[str] | None = None) -> int:
    """Print the summary of the event log named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, help="the event log, or the folder Spark wrote it in")
    parser.add_argument(
        "--min-seconds", type=float, default=1.0, help="list the jobs that took this long"
    )
    parser.add_argument(
        "--queries", action="store_true", help="also list every SQL query (action) and its jobs"
    )
    args = parser.parse_args(argv)
    try:
        path = event_file(args.log)
        if path.suffix in COMPRESSED:
            print(
                f"analytics_events: {path} is compressed ({path.suffix}): run the analysis "
                "with --conf spark.eventLog.compress=false",
                file=sys.stderr,
            )
            return 2
        with path.open(encoding="utf-8") as lines:
            log = read_events(lines)
    except (OSError, ValueError, KeyError) as error:
        print(f"analytics_events: cannot read {args.log}: {error}", file=sys.stderr)
        return 2
    print(f"event log: {path}")
    for line in summary(log, args.min_seconds):
        print(line)
    if args.queries:
        for line in query_summary(log):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
