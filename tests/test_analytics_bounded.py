"""Bounded findings: exact counts, the first rows in the report, the full list in Parquet.

The network data and its fixtures are those of ``tests/test_analytics.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from persistence.analytics import CheckSettings, analyze, parse_node_argument
from persistence.analytics.report import render_text
from tests.analytics_data import Injected, NetworkData
from tests.test_analytics import broken, clean, require_jdbc, rows

__all__ = ["broken", "clean"]  # module-scoped fixtures, shared with tests/test_analytics.py


@pytest.mark.spark
def test_stuck_findings_are_bounded_with_exact_counts_and_the_full_list_in_parquet(
    spark: Any, broken: tuple[NetworkData, Injected], tmp_path: Path
) -> None:
    """Judged two days on, most flows are stuck: the report keeps the first rows only."""
    require_jdbc()
    data, injected = broken
    sources = [parse_node_argument(s) for s in data.sources(injected.nodes)]
    later = data.now_ms + 2 * 86_400_000
    whole = analyze(sources, CheckSettings(as_of_ms=later, grace_ms=30_000), spark=spark)
    every = rows(whole, "stuck_flows")
    assert len(every) > 3
    folder = tmp_path / "findings"
    bounded = analyze(
        sources,
        CheckSettings(as_of_ms=later, grace_ms=30_000, report_rows=2),
        spark=spark,
        findings_dir=str(folder),
    )
    check = bounded.check("stuck_flows")
    assert check.table.total == len(every) == check.findings
    assert [dict(zip(check.table.columns, r, strict=True)) for r in check.table.rows] == every[:2]
    assert check.summary == whole.check("stuck_flows").summary + "; the 2 longest shown"
    written = spark.read.parquet(str(folder / "stuck_flows"))
    assert written.columns == check.table.columns
    key = ("node", "flow_id", "session_id")
    assert sorted((tuple(r[k] for k in key), r.asDict()) for r in written.collect()) == sorted(
        (tuple(r[k] for k in key), r) for r in every
    )
    assert bounded.findings["stuck_flows"] == str(folder / "stuck_flows")
    assert {p.name for p in folder.iterdir()} >= {"stuck_flows", "session_consistency"}
    text = render_text(bounded)
    assert f"{len(every)} findings; the report keeps the first 2" in text
