"""Where the driver JVM of an analysis spends its CPU, method by method: a JFR profile.

Run ``python benchmarks/analytics_profile.py [--out DIR] -- fiberflow analyze ...``: the
command runs with Java Flight Recorder on in every JVM it starts (``JAVA_TOOL_OPTIONS``:
the ``profile`` settings, every compilation recorded), and the recording of the last JVM to
exit (Spark's driver: the launcher before it exits first) is summed up with the JDK's
``jfr`` tool:

* the execution samples of Spark's task threads (``Executor task launch worker``): the
  methods on top of the stack (where the CPU is), and how many samples run under each of a
  few markers (the top-N ranking, the columnar cache's compression, an observation, a sort,
  the Parquet reader), so that a cost seen in a check's time can be named;
* the JIT's compilations by tier (C1, C2) and by what was compiled: Spark's generated code,
  Janino (the compiler Spark compiles it with), Catalyst, the JDK, ... (the sum of their
  durations: a compiler thread's time, which on two cores is the tasks' time too).

docs/analytics.md (*Keys instead of ids, and the JIT's share*) quotes its figures. The
samples are statistical (about a hundred a second per thread), the compilation times are
the JIT's own; neither slows the run by more than a few percent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MARKERS = {
    "TakeOrderedAndProjectExec": "top-N ranking (orderBy + limit)",
    "gatherCompressibilityStats": "columnar cache: choosing each column's compression",
    "CollectMetricsExec": "an observation (Observation)",
    "UnsafeExternalRowSorter": "a sort (sort-merge join, orderBy)",
    "UnsafeFixedWidthAggregationMap": "hash aggregation, the general map",
    "VectorizedColumnReader": "Parquet decoding",
    "MemoryStore.putIterator": "building a cached or checkpointed frame",
    "UnsafeWriter.write": "writing rows (a stage's output, a copy for an operator)",
    "CollationAwareUTF8String": "collation-aware string functions (ICU: lower, upper, ...)",
}
"""Method-name markers counted under the task threads' stacks, with what each names."""

TASK_THREAD = "Executor task launch worker"
"""The name Spark gives its task threads."""


def _method(frame: dict[str, Any]) -> str:
    method = frame["method"]
    return f"{method['type']['name'].split('/')[-1]}.{method['name']}"


def _seconds(duration: str) -> float:
    """An ISO 8601 duration of ``jfr print --json`` (``PT0.123S``, ``PT1M2.5S``) in seconds."""
    text = duration.removeprefix("PT")
    minutes = 0.0
    if "M" in text:
        head, text = text.split("M", 1)
        minutes = float(head)
    return minutes * 60 + float(text.removesuffix("S") or 0)


def _kind(qualified: str) -> str:
    """What a compiled method belongs to, for the compilation summary."""
    if "GeneratedClass" in qualified:
        return "Spark's generated code"
    for marker, kind in (
        ("org/codehaus/janino", "Janino"),
        ("org/codehaus/commons", "Janino"),
        ("spark/sql/catalyst", "Catalyst"),
        ("spark/sql/execution", "Spark SQL execution"),
        ("org/apache/spark", "Spark core"),
        ("org/apache/parquet", "Parquet"),
        ("scala/", "Scala library"),
        ("java/", "JDK"),
        ("jdk/", "JDK"),
        ("sun/", "JDK"),
    ):
        if marker in qualified:
            return kind
    return "other"


def _events(jfr: str, recording: Path, event: str) -> list[dict[str, Any]]:
    printed = subprocess.run(
        [jfr, "print", "--json", "--stack-depth", "64", "--events", event, str(recording)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    events: list[dict[str, Any]] = json.loads(printed)["recording"]["events"]
    return events


def callers(
    samples: list[dict[str, Any]], method: str, depth: int = 5, top: int = 10
) -> list[tuple[int, str]]:
    """The commonest call paths into ``method`` (``Class.method``) in ``samples``.

    Each sample whose stack holds ``method`` counts once, for the ``depth`` frames below its
    innermost call of it (``caller < caller's caller < ...``), so a hot method is traced to
    the operator that runs it.
    """
    paths: Counter[str] = Counter()
    for sample in samples:
        names = [_method(frame) for frame in sample["values"]["stackTrace"]["frames"]]
        if method in names:
            at = names.index(method)
            paths[" < ".join(names[at + 1 : at + 1 + depth])] += 1
    return [(count, path) for path, count in paths.most_common(top)]


def summarize(recording: Path, top: int = 25, traced: Sequence[str] = ()) -> None:
    """Print the task threads' hottest methods, the markers and the JIT's compilations.

    ``traced`` methods (``Class.method``) are shown with their commonest call paths.
    """
    jfr = shutil.which("jfr") or str(Path(os.environ.get("JAVA_HOME", "/usr")) / "bin" / "jfr")
    samples = _events(jfr, recording, "jdk.ExecutionSample")
    tasks = [s for s in samples if s["values"]["sampledThread"]["javaName"].startswith(TASK_THREAD)]
    hottest: Counter[str] = Counter()
    marked: Counter[str] = Counter()
    for sample in tasks:
        frames = sample["values"]["stackTrace"]["frames"]
        if frames:
            hottest[_method(frames[0])] += 1
        names = " ".join(_method(frame) for frame in frames)
        for marker in MARKERS:
            if marker in names:
                marked[marker] += 1
    print(f"execution samples: {len(samples)}, of Spark's task threads {len(tasks)}")
    print(f"\nthe task threads' hottest methods (top of the stack), of {len(tasks)} samples:")
    for name, count in hottest.most_common(top):
        print(f"  {count:6d}  {count / max(len(tasks), 1):6.1%}  {name}")
    print("\nsamples of the task threads under each marker (a sample may be under several):")
    for marker, meaning in MARKERS.items():
        count = marked[marker]
        print(f"  {count:6d}  {count / max(len(tasks), 1):6.1%}  {marker}: {meaning}")
    for method in traced:
        print(f"\nthe task threads' call paths into {method}:")
        for count, path in callers(tasks, method):
            print(
                f"  {count:6d}  {count / max(len(tasks), 1):6.1%}  {path or '(no caller recorded)'}"
            )
    compilations = _events(jfr, recording, "jdk.Compilation")
    seconds: dict[tuple[str, str], float] = {}
    counts: Counter[tuple[str, str]] = Counter()
    for compilation in compilations:
        values = compilation["values"]
        tier = "C2" if values["compileLevel"] == 4 else "C1"
        method = values["method"]
        key = (tier, _kind(f"{method['type']['name']}.{method['name']}"))
        seconds[key] = seconds.get(key, 0.0) + _seconds(values["duration"])
        counts[key] += 1
    total = sum(seconds.values())
    print(f"\nthe JIT's compilations: {len(compilations)}, {total:.1f} s in all")
    for (tier, kind), spent in sorted(seconds.items(), key=lambda item: -item[1]):
        print(f"  {tier}  {spent:6.1f} s  {counts[tier, kind]:6d}  {kind}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command under JFR and summarize the recording (or summarize ``--recording``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="keep the recording in this folder")
    parser.add_argument("--recording", type=Path, help="summarize this recording, run nothing")
    parser.add_argument("--top", type=int, default=25, help="hottest methods shown")
    parser.add_argument(
        "--callers",
        action="append",
        default=[],
        metavar="CLASS.METHOD",
        help="also show the commonest call paths into this method (repeatable)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    if args.recording is not None:
        summarize(args.recording, args.top, args.callers)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to profile after --, or --recording FILE")
    folder = args.out or Path(tempfile.mkdtemp(prefix="fiberflow-jfr-"))
    folder.mkdir(parents=True, exist_ok=True)
    recording = folder / "analysis.jfr"
    options = (
        f"-XX:StartFlightRecording:filename={recording},settings=profile,"
        "jdk.Compilation#threshold=0ms"
    )
    environment = dict(os.environ)
    environment["JAVA_TOOL_OPTIONS"] = f"{environment.get('JAVA_TOOL_OPTIONS', '')} {options}"
    returned = subprocess.run(command, env=environment, check=False).returncode
    print(f"\n{' '.join(command[:2])} ... exited with {returned}; recording: {recording}")
    if not recording.exists():
        print("no recording was written (did the command start a JVM?)", file=sys.stderr)
        return 2
    summarize(recording, args.top, args.callers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
