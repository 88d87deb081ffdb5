"""The analysis run several times in one process: the cold pass against the warm ones.

``fiberflow analyze`` starts a new JVM every time, so each of its queries is planned, its
code generated and compiled, and Spark's own code interpreted and compiled by the JIT for
the first time. This runs the whole analysis (every check and the report's collection,
:func:`persistence.analytics.running.analyze`) ``--passes`` times on one Spark session from a
Parquet export and prints each pass's wall time and its checks' times. The first pass is
what the command pays; the later ones what the same queries cost once the JVM is warm; and
on a small export (``benchmarks/analytics.py --rows 20000``, or any export) what is left
is the queries' own cost, whatever the rows: the floor a faster pass over the rows cannot
go below (figures in docs/analytics.md, *Benchmark*).

Run: ``python benchmarks/analytics_passes.py --export-dir DIR --node NAME=URL ...
[--passes 3] [--as-of MS] [--conf KEY=VALUE ...]`` (the nodes and settings as for
``fiberflow analyze``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def run_passes(
    export_dir: Path,
    nodes: Sequence[str],
    passes: int,
    as_of_ms: int | None,
    conf: dict[str, str],
) -> list[tuple[float, dict[str, float]]]:
    """Each pass's wall seconds and its checks' seconds, after printing Spark's start-up."""
    from persistence.analytics.check_results import CheckSettings
    from persistence.analytics.running import analyze
    from persistence.analytics.sources import parse_node_argument
    from persistence.analytics.spark import spark_session, stop_spark

    sources = [parse_node_argument(node) for node in nodes]
    began = time.perf_counter()
    spark = spark_session("local[*]", conf=conf)
    print(f"start Spark: {time.perf_counter() - began:.1f} s", flush=True)
    measured = []
    try:
        for index in range(1, passes + 1):
            began = time.perf_counter()
            report = analyze(
                sources, CheckSettings(as_of_ms=as_of_ms), spark=spark, export_dir=export_dir
            )
            seconds = time.perf_counter() - began
            checks = {check.name: check.seconds for check in report.checks}
            measured.append((seconds, checks))
            print(f"pass {index}: {seconds:.1f} s", flush=True)
    finally:
        stop_spark(spark)
    return measured


def table(measured: Sequence[tuple[float, dict[str, float]]]) -> list[str]:
    """The passes side by side: one line per check, then the whole pass."""
    if not measured:
        return []
    names = list(measured[0][1])
    width = max(len(name) for name in [*names, "whole pass"])
    header = "".join(f"{f'pass {index}':>9}" for index in range(1, len(measured) + 1))
    lines = [f"{'seconds':<{width}}{header}"]
    for name in names:
        cells = "".join(f"{checks.get(name, 0.0):>9.1f}" for _, checks in measured)
        lines.append(f"{name:<{width}}{cells}")
    lines.append(f"{'whole pass':<{width}}" + "".join(f"{wall:>9.1f}" for wall, _ in measured))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the passes named on the command line and print their table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export-dir", type=Path, required=True, help="the Parquet export")
    parser.add_argument(
        "--node", action="append", required=True, help="NAME=URL, as for fiberflow analyze"
    )
    parser.add_argument("--passes", type=int, default=3, help="analyses in the one process")
    parser.add_argument("--as-of", type=int, default=None, help="'now' of the checks (epoch ms)")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        help="KEY=VALUE, a Spark setting (spark.driver.memory is 10g unless given)",
    )
    args = parser.parse_args(argv)
    conf = {"spark.driver.memory": "10g"}
    for item in args.conf:
        key, separator, value = item.partition("=")
        if not separator or not key:
            parser.error(f"--conf {item!r} must be KEY=VALUE")
        conf[key] = value
    if args.passes < 1:
        parser.error("--passes must be at least 1")
    if not args.export_dir.is_dir():
        parser.error(f"--export-dir {args.export_dir} is not a folder (make it with --export-only)")
    for line in table(run_passes(args.export_dir, args.node, args.passes, args.as_of, conf)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
