"""Each Spark action of an analysis: when it ran, how long, how many cores it kept busy, who ran it.

Runs ``fiberflow analyze`` in this process with every DataFrame action (``collect``,
``count``, ``first``, ``head``, ``take``, ``localCheckpoint``, ``toArrow``, ``toPandas``)
wrapped, and a thread that reads the CPU of this process and of its children (the Spark
driver JVM) from ``/proc`` a few times a second. For each action it prints, in the order
they ran:

* when it started (seconds from this tool's start) and how long it took;
* the cores it kept busy on average (CPU seconds of Python and the JVM over its wall time:
  on two cores, below 2 means a core waited for the driver or the JIT; ``-`` for a span
  shorter than two samples, too short to tell);
* the line of the analysis that ran it (the innermost frame under ``persistence/analytics``);

and before each action the gap since the previous one (the driver building frames, Python,
the report) with its cores. At the end: the actions' total beside the run's wall and CPU
time, and the actions summed by line, longest first. An action inside another (``first``
calls ``head``, which calls ``take``) counts once, as the outer one.

The figures of docs/analytics.md's *Benchmark* sections that name one action of a 10 M run
(the screening's flow index, the stuck ranking, the candidates' snapshot) come from it.
Timing one run: on two shared cores an action moves by 10 to 20% from run to run; compare
whole runs with ``farm-bench --vs``.

Run: ``python benchmarks/analytics_actions.py [--out FILE.json] -- analyze --export-dir DIR
--no-refresh --node ... --node ...`` (the arguments of ``fiberflow analyze``; a leading
``fiberflow`` is dropped).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from benchmarks.analytics_threads import descendants

ACTIONS = ("collect", "count", "first", "head", "take", "localCheckpoint", "toArrow", "toPandas")
"""The DataFrame methods timed (each runs at least one Spark job)."""
SITE_PATH = "persistence/analytics/"
"""Frames in files under this path name the line that ran an action."""
SAMPLE_SECONDS = 0.2
"""How often the CPU of the process tree is read."""


@attrs.frozen
class Action:
    """One timed action: its start and end (seconds from the start), its method and line."""

    start: float
    end: float
    method: str
    site: str

    @property
    def seconds(self) -> float:
        """How long it took."""
        return self.end - self.start


@attrs.frozen
class Sample:
    """The CPU seconds the process tree had used at a moment (seconds from the start)."""

    at: float
    cpu: float


def site_of(frames: Sequence[traceback.FrameSummary], under: str = SITE_PATH) -> str:
    """``file:line:function`` of the innermost frame in a file under ``under`` (else ``?``)."""
    for frame in reversed(frames):
        if under in frame.filename.replace(os.sep, "/"):
            return f"{Path(frame.filename).name}:{frame.lineno}:{frame.name}"
    return "?"


def cpu_at(samples: Sequence[Sample], moment: float) -> float:
    """The CPU seconds used by ``moment``: the latest sample at or before it (0 before any)."""
    used = 0.0
    for sample in samples:
        if sample.at > moment:
            break
        used = sample.cpu
    return used


def cores(samples: Sequence[Sample], start: float, end: float) -> float:
    """The cores kept busy on average between ``start`` and ``end`` (0 for an empty span)."""
    if end - start < 1e-3:
        return 0.0
    return (cpu_at(samples, end) - cpu_at(samples, start)) / (end - start)


def by_site(actions: Sequence[Action]) -> list[tuple[str, int, float]]:
    """(line, actions, seconds) for each line that ran actions, the longest total first."""
    totals: dict[str, tuple[int, float]] = {}
    for action in actions:
        count, seconds = totals.get(action.site, (0, 0.0))
        totals[action.site] = (count + 1, seconds + action.seconds)
    return sorted(
        ((site, count, seconds) for site, (count, seconds) in totals.items()),
        key=lambda item: (-item[2], item[0]),
    )


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants (``/proc``, Linux).

    Each process counts with its reaped children (``cutime``, ``cstime``), so a child that
    ended and was waited for still counts, in its parent.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    used = 0.0
    for member in (pid, *descendants(pid)):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        used += sum(int(value) for value in fields[11:15]) / ticks
    return used


class Recorder:
    """Times the actions of every DataFrame and samples the CPU of the process tree."""

    def __init__(self, under: str = SITE_PATH, sample_seconds: float = SAMPLE_SECONDS) -> None:
        self.under = under
        self.sample_seconds = sample_seconds
        self.began = time.perf_counter()
        self.actions: list[Action] = []
        self.samples: list[Sample] = []
        self._depth = threading.local()
        self._stop = threading.Event()

    def now(self) -> float:
        """Seconds since the recorder was made."""
        return time.perf_counter() - self.began

    def _sample(self) -> None:
        pid = os.getpid()
        while not self._stop.is_set():
            self._add_sample(pid)
            self._stop.wait(self.sample_seconds)

    def _add_sample(self, pid: int) -> None:
        # never less than before: a child that ended but was not waited for yet counts nowhere
        used = tree_cpu_seconds(pid)
        if self.samples:
            used = max(used, self.samples[-1].cpu)
        self.samples.append(Sample(self.now(), used))

    def _timed(self, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def timed(frame: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(recorder._depth, "value", 0)
            if depth:  # inside another action: counted as that one
                return original(frame, *args, **kwargs)
            recorder._depth.value = 1
            start = recorder.now()
            try:
                return original(frame, *args, **kwargs)
            finally:
                recorder._depth.value = 0
                site = site_of(traceback.extract_stack()[:-1], recorder.under)
                recorder.actions.append(Action(start, recorder.now(), method, site))

        return timed

    @contextmanager
    def recording(self) -> Iterator[Recorder]:
        """Wrap the actions and sample the CPU while in the block; restore both after."""
        classes = _dataframe_classes()
        saved = [
            (cls, name, cls.__dict__[name])
            for cls in classes
            for name in ACTIONS
            if name in cls.__dict__
        ]
        for cls, name, original in saved:
            setattr(cls, name, self._timed(name, original))
        sampler = threading.Thread(target=self._sample, name="cpu-sampler", daemon=True)
        sampler.start()
        try:
            yield self
        finally:
            self._stop.set()
            sampler.join()
            self._add_sample(os.getpid())
            for cls, name, original in saved:
                setattr(cls, name, original)


def _dataframe_classes() -> list[type]:
    """The DataFrame classes whose methods run the actions (Spark 4's classic one, or 3's)."""
    try:
        from pyspark.sql.classic.dataframe import DataFrame as Classic
    except ImportError:  # PySpark 3: one class
        from pyspark.sql import DataFrame

        return [DataFrame]
    return [Classic]


def _cores_text(recorder: Recorder, start: float, end: float) -> str:
    """The cores of a span, or ``-`` when it is too short for the samples to tell."""
    if end - start < 2 * recorder.sample_seconds:
        return "   -"
    return f"{cores(recorder.samples, start, end):4.2f}"


def report(recorder: Recorder, min_seconds: float) -> str:
    """The printed account: the actions in order with the gaps, the totals, the lines."""
    lines = []
    previous = 0.0
    shown = 0
    for action in recorder.actions:
        gap = action.start - previous
        if action.seconds >= min_seconds or gap >= min_seconds:
            gap_cores = _cores_text(recorder, previous, action.start)
            lines.append(f"{'':>8} gap {gap:6.2f} s  {gap_cores} cores")
            busy = _cores_text(recorder, action.start, action.end)
            lines.append(
                f"{action.start:8.1f} {action.seconds:9.2f} s  {busy} cores  "
                f"{action.method:<15} {action.site}"
            )
            shown += 1
        previous = action.end
    wall = recorder.samples[-1].at if recorder.samples else recorder.now()
    cpu = recorder.samples[-1].cpu if recorder.samples else 0.0
    in_actions = sum(action.seconds for action in recorder.actions)
    lines.append("")
    lines.append(
        f"{len(recorder.actions)} actions ({shown} shown, of at least {min_seconds} s or after "
        f"a gap as long): {in_actions:.1f} s of a run of {wall:.1f} s; CPU {cpu:.1f} s "
        f"({cpu / wall if wall else 0.0:.2f} cores)"
    )
    lines.append("")
    lines.append("by line, longest first:")
    for site, count, seconds in by_site(recorder.actions):
        lines.append(f"{seconds:9.2f} s  {count:3d}  {site}")
    return "\n".join(lines) + "\n"


def as_json(recorder: Recorder) -> dict[str, Any]:
    """The actions and the CPU samples, for a file (``--out``)."""
    return {
        "actions": [
            {**attrs.asdict(action), "cores": cores(recorder.samples, action.start, action.end)}
            for action in recorder.actions
        ],
        "samples": [attrs.asdict(sample) for sample in recorder.samples],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the analysis with its actions timed; print the account; exit as the analysis did."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the actions and samples as JSON")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=0.0,
        help="print only the actions (and gaps) at least this long (default: all)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- analyze ARGUMENTS ...")
    args = parser.parse_args(argv)
    command = list(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if command[:1] == ["fiberflow"]:
        command = command[1:]
    if command[:1] != ["analyze"]:
        parser.error(
            "give the analysis after --: analyze --export-dir DIR --node ... (or fiberflow analyze)"
        )
    from flows.cli.analyze import analyze_main

    recorder = Recorder()
    with recorder.recording():
        returned = analyze_main(command[1:])
    sys.stdout.flush()
    print(f"\nfiberflow analyze exited with {returned}\n")
    print(report(recorder, args.min_seconds), end="")
    if args.out is not None:
        args.out.write_text(json.dumps(as_json(recorder), indent=1))
    return returned


if __name__ == "__main__":
    sys.exit(main())
