"""The analysis report: collected from Spark once, then printed and saved as JSON.

:func:`collect_report` is the only function here that touches Spark; the report itself is
plain data (:class:`AnalysisReport`), so rendering needs no JVM. This module renders it as
text for a terminal (:func:`render_text`) and as JSON (:func:`report_json`);
:mod:`persistence.analytics.report_html` renders it as one self-contained HTML page.
"""

from __future__ import annotations

import datetime
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from persistence.analytics.check_results import (
    CheckResult,
    CheckSettings,
    FirstRows,
    duration,
    worst,
)
from persistence.analytics.checks import CHECKS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from persistence.analytics.snapshot import Snapshot

TIME_COLUMNS = frozenset(
    {
        "since_ms",
        "latest_ms",
        "at",
        "updated_at",
        "created_at",
        "bucket_start_ms",
        "failed_at",
        "paused_at",
        "last_alive_ms",
        "last_at",
    }
)
"""Columns holding epoch milliseconds (shown as UTC times)."""

DURATION_COLUMNS = frozenset({"waited_ms"})
"""Columns holding durations in milliseconds."""


@attrs.frozen
class Table:
    """Rows of a DataFrame, as plain values (at most the first ``row_limit``)."""

    columns: list[str]
    rows: list[list[Any]]
    total: int
    """Rows in the whole DataFrame (``rows`` may hold fewer)."""


@attrs.frozen
class CheckReport:
    """One check in the report."""

    name: str
    title: str
    status: str
    summary: str
    findings: int
    description: str
    table: Table
    extras: dict[str, Table]
    seconds: float
    """Wall time of the check (including collecting its rows)."""


@attrs.frozen
class AnalysisReport:
    """Everything the analysis found, as plain data (JSON-ready with :func:`report_json`)."""

    generated_at_ms: int
    as_of_ms: int
    status: str
    """The worst verdict: ``fail`` makes ``fiberflow analyze`` exit with 1."""
    settings: dict[str, Any]
    nodes: list[dict[str, Any]]
    snapshot_spread_ms: int
    spark: dict[str, str]
    load_seconds: float
    checks: list[CheckReport]
    findings: dict[str, str] = attrs.field(factory=dict)
    """Where each check's full findings list was written as Parquet (``--findings-dir``)."""

    def check(self, name: str) -> CheckReport:
        """The check called ``name``."""
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(name)


def _plain(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if hasattr(value, "asDict"):
        return {key: _plain(item) for key, item in value.asDict().items()}
    if isinstance(value, float) and value != value:  # NaN
        return None
    return value


def collect_table(
    frame: DataFrame, row_limit: int, total: int | None = None, first: FirstRows | None = None
) -> Table:
    """The first ``row_limit`` rows of ``frame`` and its row count.

    ``total`` is the count when ``frame`` holds only the first rows of a longer list (a
    check's bounded findings, :attr:`CheckResult.total`). ``first``: the frame's first rows
    as its check collected them (:attr:`CheckResult.first`); Spark is asked again only when
    they are fewer than ``row_limit`` without being the whole frame, or for the count of a
    longer frame.
    """
    if first is not None and (first.complete or len(first.rows) >= row_limit):
        rows = list(first.rows[:row_limit])
        if total is None and first.complete:
            total = len(first.rows)
    else:
        rows = frame.limit(row_limit).collect()
    if total is None:
        total = frame.count() if len(rows) >= row_limit else len(rows)
    return Table(
        columns=list(frame.columns),
        rows=[[_plain(value) for value in row] for row in rows],
        total=total,
    )


def _description(result: CheckResult, functions: Mapping[str, Callable[..., Any]]) -> str:
    doc = (functions[result.name].__doc__ or "") if result.name in functions else ""
    doc = re.sub(r":\w+:`([^`]+)`", r"\1", doc).replace("``", "")
    paragraphs = [" ".join(part.split()) for part in doc.strip().split("\n\n") if part.strip()]
    return (
        " ".join(paragraphs[1:2]) if len(paragraphs) > 1 else (paragraphs[0] if paragraphs else "")
    )


def collect_report(
    snapshot: Snapshot,
    results: Sequence[CheckResult],
    settings: CheckSettings,
    *,
    row_limit: int = 200,
    seconds: Mapping[str, float] | None = None,
    load_seconds: float = 0.0,
    findings: Mapping[str, str] | None = None,
) -> AnalysisReport:
    """Turn check results into an :class:`AnalysisReport` (collects their rows from Spark).

    ``findings``: the Parquet folder of each check's full findings list, when written.
    """
    functions = dict(CHECKS)
    checks = []
    for result in results:
        started = time.perf_counter()
        table = collect_table(result.frame, row_limit, result.total, result.first)
        extras = {
            key: collect_table(frame, row_limit, result.extra_totals.get(key))
            for key, frame in result.extras.items()
        }
        spent = (seconds or {}).get(result.name, 0.0) + time.perf_counter() - started
        checks.append(
            CheckReport(
                name=result.name,
                title=result.title,
                status=result.verdict.status,
                summary=result.verdict.summary,
                findings=result.verdict.findings,
                description=_description(result, functions),
                table=table,
                extras=extras,
                seconds=round(spent, 3),
            )
        )
    spark = snapshot.spark
    return AnalysisReport(
        generated_at_ms=round(time.time() * 1000),
        as_of_ms=settings.as_of_ms if settings.as_of_ms is not None else snapshot.taken_at_ms,
        status=worst(results),
        settings=attrs.asdict(settings),
        nodes=[attrs.asdict(node) for node in snapshot.nodes],
        snapshot_spread_ms=snapshot.spread_ms,
        spark={"master": str(spark.sparkContext.master), "version": str(spark.version)},
        load_seconds=round(load_seconds, 3),
        checks=checks,
        findings=dict(findings or {}),
    )


def report_json(report: AnalysisReport) -> dict[str, Any]:
    """The report as a JSON-ready dict."""
    data: dict[str, Any] = attrs.asdict(report)
    return data


def write_json(report: AnalysisReport, path: str) -> None:
    """Save the report as JSON."""
    with open(path, "w", encoding="utf-8") as file:
        json.dump(report_json(report), file, indent=2, ensure_ascii=False)
        file.write("\n")


def iso(ms: int | None) -> str:
    """Epoch milliseconds as a UTC time, ``2027-01-15 08:00:00.000Z``."""
    if ms is None:
        return ""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def format_value(column: str, value: Any) -> str:
    """A cell as people read it (times, durations, lists)."""
    if value is None:
        return ""
    if column in TIME_COLUMNS and isinstance(value, int):
        return iso(value)
    if column in DURATION_COLUMNS and isinstance(value, int):
        return duration(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(format_value(column, item) for item in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# --- text ---------------------------------------------------------------------------------


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def text_table(table: Table, max_rows: int = 20, max_width: int = 44, indent: str = "  ") -> str:
    """An aligned plain-text table (long cells clipped), with a "more rows" line."""
    if not table.rows:
        return f"{indent}(none)"
    shown = table.rows[:max_rows]
    whole = TIME_COLUMNS | DURATION_COLUMNS
    cells = [
        [
            format_value(c, v) if c in whole else _clip(format_value(c, v), max_width)
            for c, v in zip(table.columns, row, strict=True)
        ]
        for row in shown
    ]
    widths = [
        max(len(column), *(len(row[i]) for row in cells)) for i, column in enumerate(table.columns)
    ]
    lines = [indent + "  ".join(c.ljust(w) for c, w in zip(table.columns, widths, strict=True))]
    lines.append(indent + "  ".join("-" * w for w in widths))
    lines += [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
    if table.total > len(shown):
        lines.append(f"{indent}... {table.total - len(shown)} more rows (see the JSON/HTML report)")
    return "\n".join(line.rstrip() for line in lines)


def naming_note(node: Mapping[str, Any]) -> str:
    """What to add after a node's read detail about where its name came from (or nothing)."""
    named_by = node.get("named_by", "argument")
    if named_by == "other nodes":
        return f"; {node['url']} is {node['name']} (named in the other nodes' tables)"
    if named_by == "unknown":
        return (
            "; its node name is in none of the other nodes' tables (give it as NAME=URL): "
            "its sessions are not matched across nodes"
        )
    return ""


def render_text(report: AnalysisReport, max_rows: int = 20) -> str:
    """The report for a terminal: nodes, verdicts, then each check's findings."""
    lines = [
        f"fiberflow analysis of {len(report.nodes)} node{'s' if len(report.nodes) != 1 else ''} "
        f"as of {iso(report.as_of_ms)} (Spark {report.spark['version']}, {report.spark['master']})",
        "",
        "Nodes",
    ]
    nodes = Table(
        ["node", "read", "checkpoints", "dedup ids", "outbox", "snapshot"],
        [
            [
                node["name"],
                node["path"],
                node["rows"]["checkpoints"],
                node["rows"]["message_ids"],
                node["rows"]["outbox"],
                node["snapshot"],
            ]
            for node in report.nodes
        ],
        len(report.nodes),
    )
    lines.append(text_table(nodes, max_width=100))
    for node in report.nodes:
        lines.append(f"  {node['name']}: {node['detail']}{naming_note(node)}")
    if report.snapshot_spread_ms:
        lines.append(
            f"  the snapshots of separate databases are {duration(report.snapshot_spread_ms)} "
            f"apart; evidence newer than {duration(report.settings['grace_ms'])} is not judged "
            "across nodes"
        )
    lines += ["", "Verdicts"]
    for check in report.checks:
        lines.append(f"  [{check.status.upper():4}] {check.title}: {check.summary}")
    for check in report.checks:
        lines += ["", f"{check.title} [{check.status.upper()}] ({check.seconds:.1f} s)"]
        if check.table.total > len(check.table.rows):
            lines.append(
                f"  {check.table.total} findings; the report keeps the first "
                f"{len(check.table.rows)} (all of them: --findings-dir)"
            )
        lines.append(text_table(check.table, max_rows))
        for key, table in check.extras.items():
            lines.append(f"  {key.replace('_', ' ')}:")
            lines.append(text_table(table, max_rows, indent="    "))
    if report.findings:
        lines += ["", "Full findings lists (Parquet)"]
        lines += [f"  {name}: {folder}" for name, folder in report.findings.items()]
    lines += ["", f"Overall: {report.status.upper()}"]
    return "\n".join(lines) + "\n"
