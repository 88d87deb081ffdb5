"""The table of benchmarks/analytics_passes.py (the Spark passes themselves need a JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.analytics_passes import main, table


def test_table_puts_the_passes_side_by_side() -> None:
    lines = table(
        [(80.0, {"flow_counts": 9.5, "stuck_flows": 12.25}), (30.0, {"flow_counts": 2.0})]
    )
    assert lines[0].split() == ["seconds", "pass", "1", "pass", "2"]
    assert lines[1].split() == ["flow_counts", "9.5", "2.0"]
    assert lines[2].split() == ["stuck_flows", "12.2", "0.0"]  # missing in pass 2: 0
    assert lines[3].split() == ["whole", "pass", "80.0", "30.0"]
    assert table([]) == []


def test_bad_arguments_fail_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = ["--node", "A=sqlite:///a.db"]
    with pytest.raises(SystemExit):
        main(["--export-dir", str(tmp_path / "none"), *node])
    assert "is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--export-dir", str(tmp_path), "--passes", "0", *node])
    assert "--passes must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--export-dir", str(tmp_path), "--conf", "spark.driver.memory", *node])
    assert "must be KEY=VALUE" in capsys.readouterr().err
