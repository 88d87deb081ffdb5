"""Does the shape of the queries change a cold analysis? Two questions, one cold process each.

The 10 M analysis spends about a third of its CPU in the JIT (``analytics_threads.py``).
This script asks whether a different shape of the same work gives the compilers less to do,
on the checkpoints of a Parquet export (``fiberflow analyze --export-only``):

* ``--read union`` (what the analysis does: each node's file read on its own, the node's name
  a literal, the reads joined in a union) or ``--read one`` (both files in one read, the node
  told by the file's path);
* ``--costs two`` (the checkpoint sizes and the journal lengths grouped in two queries, as
  ``checkpoint_costs`` does) or ``--costs one`` (one grouping: each row gives two).

It runs four queries of the checks' kind (a grouping by node, class and status with the
span of the times; the 200 longest waits on a receive; the two frequency tables) three
times, each round on a new plan, and prints their seconds. Start-up is not in the figure:
time the whole process with ``farm-bench``, and see the JIT's share with
``python benchmarks/analytics_threads.py -- python benchmarks/analytics_shapes.py ...``.

Run: ``python benchmarks/analytics_shapes.py --export-dir DIR [--read union|one]
[--costs two|one]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from persistence.analytics.export import MANIFEST
from persistence.analytics.spark import spark_session

COLUMNS = (
    "flow_id",
    "flow_class",
    "status",
    "suspended_on",
    "updated_at",
    "checkpoint_bytes",
    "journal_length",
)
"""The checkpoint columns the four queries read."""
AS_OF_MS = 1_800_090_000_000
"""``benchmarks/analytics.py``'s "as of" (an hour after its flows' day)."""
ROUNDS = 3
"""How many times the four queries run (each round on a new plan)."""


def checkpoint_files(export_dir: Path) -> dict[str, str]:
    """Each exported node's name and its checkpoints file, from the export's manifest."""
    manifest = json.loads((export_dir / MANIFEST).read_text())
    return {
        name: str(export_dir / entry["folder"] / "checkpoints.parquet")
        for name, entry in manifest["nodes"].items()
    }


def checkpoints(spark: Any, files: dict[str, str], read: str) -> Any:
    """The nodes' checkpoints as one frame with ``node``: a union of reads, or one read."""
    from pyspark.sql import functions as F

    if read == "union":
        parts = [
            spark.read.parquet(path).select(F.lit(name).alias("node"), *COLUMNS)
            for name, path in files.items()
        ]
        frame = parts[0]
        for part in parts[1:]:
            frame = frame.unionByName(part)
        return frame
    path = F.col("_metadata.file_path")
    node = F.lit(None).cast("string")
    for name, file in files.items():
        node = F.when(path.endswith(file), F.lit(name)).otherwise(node)
    return spark.read.parquet(*files.values()).select(node.alias("node"), *COLUMNS)


def run_queries(frame: Any, costs: str) -> float:
    """The four queries, :data:`ROUNDS` times: their seconds."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    stuck_before = AS_OF_MS - 10 * 60_000
    for round_number in range(ROUNDS):
        frame.groupBy("node", "flow_class", "status").agg(
            F.count("*"), F.min("updated_at"), F.max("updated_at")
        ).collect()
        waiting = (
            (F.col("status") != "HOSPITALIZED")
            & (F.col("suspended_on") == "Receive")
            & (F.col("updated_at") <= stuck_before)
        )
        frame.where(waiting).orderBy("updated_at", "node", "flow_id").limit(200).collect()
        if costs == "one":
            measures = F.array(
                F.struct(F.lit("bytes").alias("measure"), F.col("checkpoint_bytes").alias("value")),
                F.struct(
                    F.lit("journal").alias("measure"),
                    F.col("journal_length").cast("bigint").alias("value"),
                ),
            )
            frame.select(F.inline(measures)).groupBy("measure", "value").count().collect()
        else:
            frame.groupBy("checkpoint_bytes").count().collect()
            frame.groupBy("journal_length").count().collect()
        frame = frame.where(F.col("updated_at") > round_number)  # a new plan each round
    return time.perf_counter() - started


def main() -> None:
    """Parse the arguments, start Spark, run the queries, print their seconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export-dir", type=Path, required=True)
    parser.add_argument("--read", choices=("union", "one"), default="union")
    parser.add_argument("--costs", choices=("two", "one"), default="two")
    parser.add_argument("--driver-memory", default="10g")
    args = parser.parse_args()
    files = checkpoint_files(args.export_dir)
    spark = spark_session("local[*]", conf={"spark.driver.memory": args.driver_memory})
    seconds = run_queries(checkpoints(spark, files, args.read), args.costs)
    print(f"read {args.read}, costs {args.costs}: the queries took {seconds:.1f} s")


if __name__ == "__main__":
    main()
