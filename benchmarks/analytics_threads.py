"""Where an analysis spends its CPU: the driver JVM's threads, grouped, beside the wall time.

Runs a command (``fiberflow analyze ...``, or anything that starts a ``local`` Spark driver)
and, while it runs, reads the CPU time of every thread of the Spark driver JVM from
``/proc/<pid>/task/<tid>/stat`` (Linux) a few times a second, keeping each thread's last
reading, so threads that end early still count. At the end it prints the process wall time,
the CPU of the command's own process (Python) and the JVM's CPU by group of threads:

* ``tasks``: Spark's task threads (the rows read, filtered, grouped, ranked);
* ``JIT C2`` and ``JIT C1``: HotSpot's compilers (the optimising one and the quick one);
* ``driver``: the threads that serve the Python driver (Py4J: planning each query,
  generating and compiling its code) and Spark's query-stage threads;
* ``GC``: the garbage collector's threads;
* ``other``: the rest (schedulers, listeners, the VM thread).

Beside each group it prints the part of its CPU spent in the kernel: on a virtual machine
whose fresh memory is slow to fault in, the garbage collector's and the tasks' first
touches of new heap pages show there (docs/analytics.md, *Benchmark*).

A figure of a single run: on two shared cores they move by several percent from run to run,
so compare the shares, and whole runs with ``farm-bench --vs``. It found that the JIT takes
about a third of the CPU of the 10 M analysis (docs/analytics.md, *Benchmark*).

Run: ``python benchmarks/analytics_threads.py -- fiberflow analyze --export-dir DIR ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

GROUPS = (
    ("tasks", re.compile(r"^Executor task")),
    ("JIT C2", re.compile(r"^C2 Compiler")),
    ("JIT C1", re.compile(r"^C1 Compiler")),
    ("GC", re.compile(r"^(GC Thread|ParGC|G1 |VM Periodic)")),
    ("driver", re.compile(r"^(Thread-\d+|ResultQueryStag|shuffle-exchang|broadcast-exch)")),
)
"""Thread-name patterns (as ``/proc`` shows them: the first 15 characters) by group."""

SAMPLE_SECONDS = 0.2
"""How often the threads are read."""


def group_of(thread_name: str) -> str:
    """The group of a JVM thread by its name (``other`` when none matches)."""
    for group, pattern in GROUPS:
        if pattern.search(thread_name):
            return group
    return "other"


def _ticks_per_second() -> int:
    return int(os.sysconf("SC_CLK_TCK"))


def _cpu_seconds(stat: str) -> tuple[str, float, float]:
    """(name, user + system CPU seconds, system CPU seconds) of one ``/proc/.../stat`` line."""
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = _ticks_per_second()
    return name, (int(fields[11]) + int(fields[12])) / ticks, int(fields[12]) / ticks


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from each process's parent in ``/proc``)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, of in parents.items() if of == parent]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _driver_jvm(pid: int) -> int | None:
    """The Spark driver JVM among ``pid``'s descendants (its command line names SparkSubmit)."""
    for child in descendants(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"org.apache.spark.deploy.SparkSubmit" in command and b"java" in command:
            return child
    return None


def _read_threads(pid: int, threads: dict[str, tuple[str, float, float]]) -> None:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            threads[tid] = _cpu_seconds(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
        except (OSError, ValueError, IndexError):
            continue


def measure(command: list[str]) -> tuple[float, float, dict[str, tuple[float, float]]]:
    """Run ``command``: (wall seconds, its own process's CPU seconds, JVM CPU by group).

    Each group's CPU is (all of it, the part spent in the kernel).
    """
    started = time.perf_counter()
    process = subprocess.Popen(command)
    threads: dict[str, tuple[str, float, float]] = {}
    own = 0.0
    jvm: int | None = None
    while process.poll() is None:
        with contextlib.suppress(OSError):
            own = _cpu_seconds(Path(f"/proc/{process.pid}/stat").read_text())[1]
        if jvm is None:
            jvm = _driver_jvm(process.pid)
        if jvm is not None:
            _read_threads(jvm, threads)
        time.sleep(SAMPLE_SECONDS)
    wall = time.perf_counter() - started
    if process.returncode not in (0, 1):
        print(f"the command exited with {process.returncode}", file=sys.stderr)
    groups: dict[str, tuple[float, float]] = {}
    for name, seconds, kernel in threads.values():
        group = group_of(name)
        before, before_kernel = groups.get(group, (0.0, 0.0))
        groups[group] = (before + seconds, before_kernel + kernel)
    return wall, own, groups


def main() -> None:
    """Parse the arguments, run the command once, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args()
    command = [part for part in args.command if part != "--"] if args.command else []
    if not command:
        parser.error("give the command to measure after --")
    wall, own, groups = measure(command)
    total = sum(seconds for seconds, _ in groups.values())
    kernel = sum(part for _, part in groups.values())
    print(f"wall {wall:.1f} s; the command's own process {own:.1f} s of CPU")
    if not total:
        print("no Spark driver JVM was seen (is the master local?)")
        return
    print(
        f"driver JVM {total:.1f} s of CPU ({total / wall:.2f} cores on average), "
        f"{kernel:.1f} s of it in the kernel:"
    )
    for group, (seconds, in_kernel) in sorted(groups.items(), key=lambda item: -item[1][0]):
        print(f"  {group:8s} {seconds:7.1f} s  {seconds / total:6.1%}  kernel {in_kernel:6.1f} s")


if __name__ == "__main__":
    main()
