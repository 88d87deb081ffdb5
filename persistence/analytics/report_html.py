"""The analysis report as one self-contained HTML page: charts, verdict cards, findings.

:func:`render_html` turns an :class:`~persistence.analytics.report.AnalysisReport` (plain
data, no Spark) into a page with the overall verdict at the top (``id="verdict"``), a
verdict card per check, failing checks first, each linking to its findings section (the
section's id is the check's name), inline SVG charts (status counts per node, the
checkpoint size histogram, flows per status over time), and each check's findings as
tables that fit the page: long cells wrap, and a table's first columns and its reason
column are shown while the rest of each row folds into a ``details`` element. Everything the
tables hold is escaped; the page fetches nothing.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from persistence.analytics.check_results import FAIL, INFO, OK, STATUS_ORDER, WARN, duration
from persistence.analytics.report import (
    AnalysisReport,
    CheckReport,
    Table,
    format_value,
    iso,
    naming_note,
)

STATUS_COLOURS = {
    "COMPLETED": "#2e9d57",
    "FAILED": "#d64541",
    "HOSPITALIZED": "#f08c00",
    "SUSPENDED": "#3b7dd8",
    "RUNNABLE": "#17a2b8",
    "UNSTARTED": "#8a94a6",
}
"""The colour of each flow status in the charts."""
VERDICT_COLOURS = {OK: "#2e9d57", INFO: "#3b7dd8", WARN: "#f08c00", FAIL: "#d64541"}
"""The colour of each verdict status on the cards and badges."""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _bar_colour(status: str, index: int) -> str:
    palette = ["#6f42c1", "#20c997", "#fd7e14", "#e83e8c", "#6610f2", "#795548"]
    return STATUS_COLOURS.get(status, palette[index % len(palette)])


def _svg_text(x: float, y: float, text: str, anchor: str = "start", css: str = "small") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{css}">{_e(text)}</text>'


def _svg_rect(x: float, y: float, width: float, height: float, colour: str, tip: str) -> str:
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" '
        f'fill="{colour}"><title>{_e(tip)}</title></rect>'
    )


def _legend(statuses: Sequence[str], x: int, y: int) -> str:
    parts = []
    for i, status in enumerate(statuses):
        cx = x + i * 130
        parts.append(_svg_rect(cx, y, 12, 12, _bar_colour(status, i), status))
        parts.append(_svg_text(cx + 17, y + 11, status))
    return "".join(parts)


def _status_rank(status: str) -> int:
    return list(STATUS_COLOURS).index(status) if status in STATUS_COLOURS else 99


def status_chart(counts: Table) -> str:
    """SVG: one horizontal bar per node, split by status."""
    per_node: dict[str, dict[str, int]] = {}
    statuses: list[str] = []
    for node, _flow_class, status, flows in counts.rows:
        per_node.setdefault(node, {})
        per_node[node][status] = per_node[node].get(status, 0) + int(flows)
        if status not in statuses:
            statuses.append(status)
    statuses.sort(key=_status_rank)
    if not per_node:
        return "<p>No flows.</p>"
    label_width, bar_width, row = 230, 520, 30
    biggest = max(sum(values.values()) for values in per_node.values()) or 1
    height = row * len(per_node) + 50
    width = label_width + bar_width + 60
    parts = [f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="flows by status">']
    for i, (node, values) in enumerate(per_node.items()):
        y = 10 + i * row
        parts.append(_svg_text(label_width - 8, y + 15, node, "end"))
        x = float(label_width)
        for j, status in enumerate(statuses):
            count = values.get(status, 0)
            if not count:
                continue
            span = bar_width * count / biggest
            tip = f"{node}: {count} {status}"
            parts.append(_svg_rect(x, y, span, 20, _bar_colour(status, j), tip))
            if span > 22:
                parts.append(_svg_text(x + span / 2, y + 14, str(count), "middle", "bar"))
            x += span
        parts.append(_svg_text(x + 6, y + 15, str(sum(values.values()))))
    parts.append(_legend(statuses, label_width, height - 24))
    parts.append("</svg>")
    return "".join(parts)


def _size(value: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value} {unit}"
        value //= 1024
    return f"{value} TiB"


def nice_ceiling(value: int) -> int:
    """The top of a count axis: the smallest of 4, 8, 20, 40, 60, 80, 100, 200... >= ``value``.

    Its quarter ticks are whole numbers.
    """
    for exponent in range(19):
        for step in (1, 2, 4, 6, 8):
            top = int(step * 10**exponent)
            if top >= max(value, 4) and top % 4 == 0:
                return top
    return value


def column_chart(
    labels: Sequence[str],
    series: Mapping[str, Sequence[int]],
    title: str,
    width: int = 760,
    y_label: str = "",
) -> str:
    """SVG: vertical (stacked) columns, one per label, one colour per series.

    The legend (when there is more than one series, or a status) sits above the plot; the
    labels are slanted below it; a column is at most 70 units wide.
    """
    if not labels:
        return "<p>No data.</p>"
    legend = len(series) > 1 or next(iter(series)) in STATUS_COLOURS
    top = 34 if legend else 14
    height, left, bottom, right = 320, 96, 92, 10
    slot = (width - left - right) / len(labels)
    column = min(slot * 0.8, 70.0)
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    biggest = nice_ceiling(max(totals))
    plot = height - bottom - top
    parts = [f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">']
    if legend:
        parts.append(_legend(list(series), left, 6))
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        y = top + plot * (1 - fraction)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(_svg_text(left - 6, y + 4, f"{round(biggest * fraction):,}", "end"))
    if y_label:
        lx, ly = 14, top + plot / 2
        parts.append(
            f'<text x="{lx}" y="{ly:.1f}" text-anchor="middle" class="small" '
            f'transform="rotate(-90 {lx} {ly:.1f})">{_e(y_label)}</text>'
        )
    every = 1 if len(labels) <= 16 else max(1, len(labels) // 12)
    for i, label in enumerate(labels):
        x = left + i * slot + (slot - column) / 2
        y = float(top + plot)
        for j, (name, values) in enumerate(series.items()):
            if not values[i]:
                continue
            h = plot * values[i] / biggest
            y -= h
            tip = f"{label}: {values[i]} {name}"
            parts.append(_svg_rect(x, y, column, h, _bar_colour(name, j), tip))
        if i % every == 0:
            cx, cy = x + column / 2, top + plot + 14
            parts.append(
                f'<text x="{cx:.1f}" y="{cy}" text-anchor="end" class="small" '
                f'transform="rotate(-35 {cx:.1f} {cy})">{_e(label)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def histogram_chart(histogram: Table) -> str:
    """SVG: checkpoints per power-of-two size bucket (empty buckets in between shown)."""
    counts = {int(low): int(flows) for low, _high, flows in histogram.rows}
    if not counts:
        return "<p>No live checkpoints.</p>"
    low, high = min(counts), max(counts)
    buckets = [low]
    while buckets[-1] < high:
        buckets.append(buckets[-1] * 2 if buckets[-1] else 1)
    labels = [f"{_size(start)} to {_size(start * 2 if start else 1)}" for start in buckets]
    values = [counts.get(start, 0) for start in buckets]
    return column_chart(labels, {"checkpoints": values}, "checkpoint sizes", y_label="checkpoints")


def timeline_chart(over_time: Table) -> str:
    """SVG: flows per status in each time bucket."""
    series: dict[str, dict[int, int]] = {}
    step = 0
    for _bucket, start, status, flows, bucket_ms in over_time.rows:
        series.setdefault(status, {})[int(start)] = int(flows)
        step = int(bucket_ms)
    starts = sorted({start for counts in series.values() for start in counts})
    if starts and step and (starts[-1] - starts[0]) // step <= 240:  # the empty buckets too
        starts = list(range(starts[0], starts[-1] + step, step))
    labels = [iso(start)[:19] for start in starts]
    ordered = sorted(series, key=_status_rank)
    columns = {status: [series[status].get(s, 0) for s in starts] for status in ordered}
    return column_chart(labels, columns, "flows over time", width=1500, y_label="flows")


SHOWN_COLUMNS = 5
"""How many of a findings table's first columns are shown in it (its reason column too)."""
REASON_COLUMNS = ("problem", "detail", "reason", "error", "error_message")
"""Columns saying what is wrong: always shown, after the first :data:`SHOWN_COLUMNS`."""


def split_columns(
    columns: Sequence[str], shown: int = SHOWN_COLUMNS
) -> tuple[list[str], list[str]]:
    """The columns a findings table shows and those folded into each row's details.

    The first ``shown`` columns (the check puts what identifies a finding first) and any
    reason column (:data:`REASON_COLUMNS`) are shown; the rest are folded.
    """
    first = list(columns[:shown])
    reasons = [c for c in columns[shown:] if c in REASON_COLUMNS]
    return first + reasons, [c for c in columns if c not in first and c not in reasons]


def _details(folded: Sequence[tuple[str, Any]]) -> str:
    items = "".join(
        f"<dt>{_e(column)}</dt><dd>{_e(format_value(column, value))}</dd>"
        for column, value in folded
    )
    return f"<details><summary>{len(folded)} more</summary><dl>{items}</dl></details>"


def html_table(table: Table, max_rows: int = 200, shown: int | None = SHOWN_COLUMNS) -> str:
    """An HTML table (times and durations formatted), with a "more rows" note.

    With ``shown``, only the columns :func:`split_columns` picks are columns of the table;
    the others of each row are in a last "more" column's ``details``. ``None`` shows all.
    """
    if not table.rows:
        return '<p class="none">None.</p>'
    inline, folded = split_columns(table.columns, shown) if shown else (table.columns, [])
    place = {column: index for index, column in enumerate(table.columns)}
    head = "".join(f"<th>{_e(c)}</th>" for c in inline) + ("<th>more</th>" if folded else "")
    body = "".join(
        "<tr>"
        + "".join(f"<td>{_e(format_value(c, row[place[c]]))}</td>" for c in inline)
        + (f"<td>{_details([(c, row[place[c]]) for c in folded])}</td>" if folded else "")
        + "</tr>"
        for row in table.rows[:max_rows]
    )
    more = ""
    left = table.total - min(len(table.rows), max_rows)
    if left > 0:
        more = f'<p class="none">{left} more rows in the JSON report.</p>'
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>{more}"
    )


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;background:#f5f6f8;
color:#1d2433}
header{background:#1d2433;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header p{margin:0;color:#c5cbd6}main{padding:20px 28px;max-width:1200px}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600;
font-size:13px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:12px;
margin:14px 0}
.card{background:#fff;border-radius:8px;padding:12px 14px;border-left:6px solid #999;
box-shadow:0 1px 2px #0001}
.card h3{margin:0 0 6px;font-size:15px}.card p{margin:0;font-size:13px;color:#4a5468}
section{background:#fff;border-radius:8px;padding:14px 18px;margin:14px 0;
box-shadow:0 1px 2px #0001}
section h2{margin:0 0 8px;font-size:18px}.desc{color:#4a5468;font-size:13px;margin:0 0 10px}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:12px}.charts section{margin:0}
.wide{grid-column:1 / -1}
.scroll{overflow:auto;max-height:480px}table{border-collapse:collapse;font-size:12px;width:100%}
th,td{text-align:left;vertical-align:top;padding:4px 8px;border-bottom:1px solid #e3e6eb;
overflow-wrap:anywhere;word-break:break-word}
th{background:#f0f2f5;position:sticky;top:0}.none{color:#6b7385;font-size:13px}
details summary{cursor:pointer;color:#3b7dd8;white-space:nowrap}dl{margin:4px 0}
dt{font-weight:600;color:#4a5468}dd{margin:0 0 4px}
a.card{display:block;color:inherit;text-decoration:none}a.card:hover{box-shadow:0 2px 6px #0003}
section[id]{scroll-margin-top:8px}section:target{outline:3px solid #3b7dd8}
#verdict{margin:8px 0 0;font-size:15px;color:#fff}
svg{width:100%;height:auto}svg .small{font-size:11px;fill:#4a5468}svg .bar{font-size:11px;fill:#fff}
svg .grid{stroke:#e3e6eb}h4{margin:12px 0 6px;font-size:14px}
@media (max-width:900px){.charts{grid-template-columns:1fr}}
"""


def _badge(status: str) -> str:
    colour = VERDICT_COLOURS[status]
    return f'<span class="badge" style="background:{colour}">{_e(status.upper())}</span>'


def _card(check: CheckReport) -> str:
    colour = VERDICT_COLOURS[check.status]
    return (
        f'<a class="card" href="#{_e(check.name)}" style="border-left-color:{colour}">'
        f"<h3>{_badge(check.status)} {_e(check.title)}</h3><p>{_e(check.summary)}</p></a>"
    )


def by_severity(checks: Sequence[CheckReport]) -> list[CheckReport]:
    """The checks failing first, then warnings, information, and passing (else in order)."""
    return sorted(checks, key=lambda check: -STATUS_ORDER[check.status])


def verdict_line(report: AnalysisReport) -> str:
    """The overall verdict in words: which checks failed, which warn."""
    failed = [c.title for c in report.checks if c.status == FAIL]
    warned = [c.title for c in report.checks if c.status == WARN]
    parts = []
    if failed:
        parts.append(f"{len(failed)} failed ({', '.join(failed)})")
    if warned:
        parts.append(f"{len(warned)} to look at ({', '.join(warned)})")
    said = "; ".join(parts) if parts else "every check passed"
    return f"{report.status.upper()}: {len(report.checks)} checks, {said}"


def _section(check: CheckReport) -> str:
    extras = "".join(
        f"<h4>{_e(key.replace('_', ' '))}</h4>{html_table(table)}"
        for key, table in check.extras.items()
    )
    description = f"{check.summary}. {check.description} ({check.seconds:.1f} s)"
    return (
        f'<section id="{_e(check.name)}"><h2>{_badge(check.status)} {_e(check.title)}</h2>'
        f'<p class="desc">{_e(description)}</p>{html_table(check.table)}{extras}</section>'
    )


def _charts(checks: Mapping[str, CheckReport]) -> str:
    charts = []
    if "flow_counts" in checks:
        chart = status_chart(checks["flow_counts"].table)
        charts.append(f"<section><h2>Flows by node and status</h2>{chart}</section>")
    costs = checks.get("checkpoint_costs")
    if costs is not None and "size_histogram" in costs.extras:
        chart = histogram_chart(costs.extras["size_histogram"])
        charts.append(f"<section><h2>Checkpoint sizes</h2>{chart}</section>")
    if "flows_over_time" in checks:
        chart = timeline_chart(checks["flows_over_time"].table)
        title = "Flows per status over time"
        charts.append(f'<section class="wide"><h2>{title}</h2>{chart}</section>')
    return f'<div class="charts">{"".join(charts)}</div>'


def _nodes_table(report: AnalysisReport) -> Table:
    columns = ["node", "read", "snapshot", "checkpoints", "dedup ids", "outbox"]
    columns += ["results", "exceptions", "how"]
    rows = []
    for node in report.nodes:
        counted = node["rows"]
        rows.append(
            [node["name"], node["path"], node["snapshot"]]
            + [counted[key] for key in ("checkpoints", "message_ids", "outbox")]
            + [counted[key] for key in ("results", "exceptions")]
            + [node["detail"] + naming_note(node)]
        )
    return Table(columns, rows, len(rows))


def render_html(report: AnalysisReport) -> str:
    """The report as one self-contained HTML page with charts."""
    checks = {check.name: check for check in report.checks}
    ordered = by_severity(report.checks)
    cards = "".join(_card(check) for check in ordered)
    settings = ", ".join(
        f"{key} {duration(value) if key.endswith('_ms') and value else value}"
        for key, value in report.settings.items()
        if key != "as_of_ms"
    )
    spread = ""
    if report.snapshot_spread_ms:
        spread = f"; separate snapshots {duration(report.snapshot_spread_ms)} apart"
    subtitle = (
        f"{len(report.nodes)} nodes as of {iso(report.as_of_ms)}{spread} · "
        f"Spark {report.spark['version']} ({report.spark['master']}) · "
        f"generated {iso(report.generated_at_ms)}"
    )
    nodes = (
        f'<section><h2>Nodes and snapshots</h2><p class="desc">Settings: {_e(settings)}. '
        f"Loaded in {report.load_seconds:.1f} s.</p>"
        f"{html_table(_nodes_table(report), shown=None)}</section>"
    )
    sections = "".join(_section(check) for check in ordered)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>fiberflow analysis</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{_STYLE}</style></head>\n<body><header>"
        f"<h1>fiberflow analysis {_badge(report.status)}</h1><p>{_e(subtitle)}</p>"
        f'<p id="verdict">{_e(verdict_line(report))}</p></header>\n'
        f'<main><div class="cards">{cards}</div>\n{_charts(checks)}\n{nodes}\n{sections}\n'
        "</main></body></html>\n"
    )


def write_html(report: AnalysisReport, path: str) -> None:
    """Save the report as HTML."""
    with open(path, "w", encoding="utf-8") as file:
        file.write(render_html(report))
