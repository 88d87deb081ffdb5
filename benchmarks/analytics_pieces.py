"""What each piece of the analytics' speed machinery is worth on a big export, timed in turns.

A piece of speed machinery (and each JVM option) stays only if switching it off makes the
analysis measurably slower: at least 10% of the wall time from process start on the 10 M-row
run. This benchmark runs ``fiberflow analyze`` on one kept Parquet export (the one
``benchmarks/analytics.py --read export`` makes in its ``--cache``), once with everything on
and once with each piece off, in turns (round 1: all variants, round 2: all again...), so a
shared machine's drift falls on every variant alike. Each run is a child process; a piece is
switched off in the child before the command runs, without touching the code:

* ``layout``: the export's bucketed datasets (the snapshot is read without them);
* ``screening``: the conversation screening (every check judges the whole snapshot);
* ``few_keys``: the screening's lookup of a few needed flow keys in a set (they are joined);
* ``stored_parsed``: the columns the export parses (waits, until and the session facts:
  Spark parses them from the exported text).

A variant whose piece the code no longer has is refused by name. Prints, per variant, the
median wall and CPU seconds of the child and their ratio to everything on, and what each run
found (the checks' totals must be the same in every variant).

Run: ``python benchmarks/analytics_pieces.py [--rounds 3] [--rows 10000000] [--mix realistic]
[VARIANT ...]`` after ``python benchmarks/analytics.py --rows 10000000 --mix realistic --read
export`` made the export.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.analytics import ALICE, AS_OF_MS, BOB  # noqa: E402

SWITCHES = {
    "layout": (
        "import persistence.analytics.export_reading as r; r._layouts = lambda *args: ({}, [])"
    ),
    "screening": (
        "import persistence.analytics.screening as s; assert s.SCREEN_ABOVE_ROWS; "
        "s.SCREEN_ABOVE_ROWS = 10 ** 15"
    ),
    "few_keys": (
        "import persistence.analytics.screening as s; assert s.MISSING_IN_DRIVER; "
        "s.MISSING_IN_DRIVER = -1"
    ),
    "stored_parsed": (
        "import persistence.analytics.export_reading as r; assert r.WAITS and r.FACTS; "
        "r.WAITS = r.UNTIL = r.FACTS = '(not stored)'"
    ),
}
"""What the child runs before the command to switch each piece off."""

CHILD = """
import sys
{switch}
from flows.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def run_once(variant: str, databases: Path, export: Path) -> tuple[float, float, dict[str, int]]:
    """One ``fiberflow analyze`` with ``variant``'s piece off: wall, CPU seconds, totals."""
    with tempfile.TemporaryDirectory(prefix="fiberflow-pieces-") as folder:
        report = Path(folder) / "report.json"
        command = [
            sys.executable,
            "-c",
            CHILD.format(switch=SWITCHES.get(variant, "")),
            "analyze",
            "--node",
            f"{ALICE}=sqlite:///{databases / 'alice.db'}",
            "--node",
            f"{BOB}=sqlite:///{databases / 'bob.db'}",
            "--export-dir",
            str(export),
            "--no-refresh",
            "--as-of",
            str(AS_OF_MS),
            "--conf",
            "spark.driver.memory=10g",
            "--json",
            str(report),
            "--html",
            str(Path(folder) / "report.html"),
        ]
        before = os.times()
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=folder, check=False)
        wall = time.perf_counter() - began
        after = os.times()
        if done.returncode not in (0, 1):
            raise RuntimeError(
                f"{variant}: analyze exited {done.returncode}: {done.stderr[-2000:]}"
            )
        cpu = (after.children_user - before.children_user) + (
            after.children_system - before.children_system
        )
        checks = json.loads(report.read_text())["checks"]
        return wall, cpu, {c["name"]: c["table"]["total"] for c in checks}


def main() -> None:
    """Time every variant in turns and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", default=list(SWITCHES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--mix", default="realistic")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/fiberflow-bench"))
    args = parser.parse_args()
    unknown = sorted(set(args.variants) - set(SWITCHES))
    if unknown:
        parser.error(f"no such piece: {', '.join(unknown)} (known: {', '.join(SWITCHES)})")
    databases = args.cache / f"{args.mix}-{args.rows}"
    export = args.cache / f"{args.mix}-{args.rows}-parquet"
    if not (export / "manifest.json").exists():
        parser.error(f"no export in {export}: run benchmarks/analytics.py --read export first")
    variants = ["everything on", *args.variants]
    walls: dict[str, list[float]] = {v: [] for v in variants}
    cpus: dict[str, list[float]] = {v: [] for v in variants}
    found: dict[str, dict[str, int]] = {}
    # a first run puts the files in the page cache; its findings are what every run must find
    _, _, expected = run_once("everything on", databases, export)
    for round_number in range(1, args.rounds + 1):
        for variant in variants:
            wall, cpu, totals = run_once(variant, databases, export)
            walls[variant].append(wall)
            cpus[variant].append(cpu)
            found[variant] = totals
            same = "same findings" if totals == expected else f"OTHER FINDINGS: {totals}"
            print(
                f"round {round_number} {variant:<20} wall {wall:6.1f} s  cpu {cpu:6.1f} s  "
                f"load {os.getloadavg()[0]:.1f}  {same}",
                flush=True,
            )
    base_wall = statistics.median(walls["everything on"])
    base_cpu = statistics.median(cpus["everything on"])
    print(f"\n{args.mix} mix, {args.rows:,} rows, {args.rounds} rounds in turns")
    print(f"{'piece off':<20}{'wall s':>9}{'x on':>7}{'cpu s':>9}{'x on':>7}  same findings")
    for variant in variants:
        wall, cpu = statistics.median(walls[variant]), statistics.median(cpus[variant])
        same = "yes" if found[variant] == expected else f"NO: {found[variant]}"
        print(
            f"{variant:<20}{wall:>9.1f}{wall / base_wall:>7.2f}{cpu:>9.1f}{cpu / base_cpu:>7.2f}"
            f"  {same}"
        )


if __name__ == "__main__":
    main()
