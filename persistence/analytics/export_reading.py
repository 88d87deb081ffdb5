"""Reading the Parquet export of :mod:`persistence.analytics.export` as a :class:`Snapshot`.

``fiberflow analyze --export-dir DIR`` analyzes DIR instead of the databases: each node's
tables are read from their Parquet files (checked against what the manifest says was
written), with the columns the export derived beside each row, and the bucketed datasets of
the layout when every node has them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from persistence.analytics.export import MANIFEST, iso_time
from persistence.analytics.flow_facts import FACT_FRAMES, FACTS, with_facts
from persistence.analytics.snapshot import NodeLoad, Snapshot
from persistence.analytics.sources import NodeSource
from persistence.analytics.tables import LONG, TABLES, AnalyticsLoadError
from persistence.analytics.waiting import (
    UNTIL,
    WAITS,
    with_stuck_columns,
    with_waits,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def load_export(
    spark: SparkSession, directory: str | Path, sources: Sequence[NodeSource]
) -> Snapshot:
    """The :class:`Snapshot` of ``sources`` as exported in ``directory`` (Spark reads Parquet).

    Each node's snapshot time is its export's (the report shows how fresh the data is).
    On a cluster ``directory`` must be readable by every executor.
    """
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from persistence.analytics.loading import union_frames
    from persistence.analytics.naming import apply_names, infer_node_names

    folder = Path(directory)
    manifest = json.loads((folder / MANIFEST).read_text())
    loads: dict[str, NodeLoad] = {}
    parts: dict[str, list[DataFrame]] = {frame: [] for frame in TABLES}
    by_node: dict[str, dict[str, DataFrame]] = {}
    for source in sources:
        entry = manifest["nodes"].get(source.name)
        if entry is None:
            raise AnalyticsLoadError(f"{source.name} is not in the export {folder}")
        export = entry["export"]
        for frame, (_, _, columns) in TABLES.items():
            path = (folder / entry["folder"] / f"{frame}.parquet").resolve()
            # the file holds what the manifest says it does (its footer, not a Spark job), and
            # its schema goes to Spark with it (no footer read again to infer it)
            footer = pq.read_metadata(path)
            found, written = footer.num_rows, export["tables"][frame]["rows"]
            if found != written:
                raise AnalyticsLoadError(
                    f"{source.name}: {path} holds {found} rows of {TABLES[frame][0]} but the "
                    f"export wrote {written}: the export changed while it was read"
                )
            schema = from_arrow_schema(footer.schema.to_arrow_schema())
            data = spark.read.schema(schema).parquet(str(path))
            # a column an export of an earlier format lacks is null (session_facts)
            names = [
                F.col(name)
                if name in data.columns
                else F.lit(None).cast("bigint" if kind == LONG else "string").alias(name)
                for name, kind in columns
            ]
            # what the export derived and stored beside each row (waiting.py, flow_facts.py)
            stored = (WAITS, UNTIL, FACTS)
            names += [F.col(name) for name in stored if name in data.columns]
            data = data.select(F.lit(source.name).alias("node"), *names)
            if frame == "checkpoints":  # the stuck columns, and waits an older export lacks
                data = with_stuck_columns(with_waits(data))
            if frame in FACT_FRAMES:
                data = with_facts(data)
            parts[frame].append(data)
            by_node.setdefault(source.name, {})[frame] = data
        loads[source.name] = NodeLoad(
            name=source.name,
            url=source.display_url(),
            path="export",
            detail=(
                f"Parquet export in {folder} ({'full' if export['full'] else 'incremental'} "
                f"export of {iso_time(export['taken_at_ms'] / 1000)}, {export['seconds']:.1f} s)"
            ),
            snapshot=f"exported: {export['snapshot']}",
            taken_at_ms=export["taken_at_ms"],
            rows={frame: table["rows"] for frame, table in export["tables"].items()},
        )
    frames = union_frames(parts)  # Parquet: read again by each check, only what it needs
    if not all(source.named for source in sources):
        frames, loads = apply_names(frames, loads, infer_node_names(frames, sources))
    nodes = [loads[source.name] for source in sources]
    layouts, tables = _layouts(spark, folder, manifest, sources, by_node)
    snapshot = Snapshot(spark=spark, nodes=nodes, frames=frames, layouts=layouts)
    for table in tables:
        snapshot.on_close(_dropper(spark, table))
    return snapshot


def _dropper(spark: SparkSession, table: str) -> Callable[[], object]:
    """What drops ``table`` from the session's catalog (its files stay: the export's)."""

    def drop() -> object:
        return spark.sql(f"DROP TABLE IF EXISTS {table}")

    return drop


def _layouts(
    spark: SparkSession,
    folder: Path,
    manifest: dict[str, Any],
    sources: Sequence[NodeSource],
    frames: dict[str, dict[str, DataFrame]],
) -> tuple[dict[str, DataFrame], list[str]]:
    """The bucketed datasets of every node (:mod:`persistence.analytics.layout`), else none.

    Only when every node was named on the command line (the keys hold its name). A node's
    datasets are written from its exported ``frames`` when they are missing, of another
    version, or of an earlier refresh, and the manifest then says so.
    """
    from persistence.analytics.layout import (
        BUCKETS,
        EVIDENCE,
        EVIDENCE_SCHEMA,
        FLOWS,
        FLOWS_SCHEMA,
        LAYOUT,
        register,
        write_layout,
    )

    if not all(source.named for source in sources):
        return {}, []
    entries = [manifest["nodes"][source.name] for source in sources]
    written = False
    for source, entry in zip(sources, entries, strict=True):
        of = entry["export"]["taken_at_ms"]
        layout = entry.get("layout") or {}
        if [layout.get(key) for key in ("version", "buckets", "of")] != [LAYOUT, BUCKETS, of]:
            layout = write_layout(folder / entry["folder"], frames[source.name], source.name)
            entry["layout"] = {**layout, "of": of}
            written = True
    if written:
        temporary = folder / f"{MANIFEST}.{os.getpid()}.tmp"
        temporary.write_text(json.dumps(manifest, indent=2))
        temporary.replace(folder / MANIFEST)
    layouts: dict[str, DataFrame] = {}
    made: list[str] = []
    for name, columns in ((EVIDENCE, EVIDENCE_SCHEMA), (FLOWS, FLOWS_SCHEMA)):
        folders = [folder / entry["folder"] / name for entry in entries]
        layouts[name], tables = register(spark, folders, name, columns)
        made += tables
    return layouts, made
