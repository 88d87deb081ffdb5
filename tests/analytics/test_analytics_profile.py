"""The JFR summary of benchmarks/analytics_profile.py, on a recording of a JVM run here."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.analytics_profile import _kind, _seconds, callers, main
from persistence.analytics.spark import java_problem
from tests.conftest import require_service


def test_jfr_durations_and_what_a_compiled_method_belongs_to() -> None:
    assert _seconds("PT0.25S") == 0.25
    assert _seconds("PT1M2.5S") == 62.5
    assert _seconds("PT0S") == 0.0
    assert _kind("org/codehaus/janino/UnitCompiler.compile") == "Janino"
    assert _kind("org/apache/spark/sql/catalyst/expressions/GeneratedClass$X.processNext") == (
        "Spark's generated code"
    )
    assert _kind("org/apache/spark/sql/catalyst/trees/TreeNode.transform") == "Catalyst"
    assert _kind("java/util/HashMap.put") == "JDK"
    assert _kind("py4j/GatewayServer.run") == "other"


def test_a_jvm_run_under_the_profiler_is_recorded_and_summed_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_service("Java", java_problem())
    source = tmp_path / "Spin.java"
    source.write_text(
        "public class Spin { public static void main(String[] a) {"
        " long s = 0; for (long i = 0; i < 400_000_000L; i++) { s += i % 7; }"
        " System.out.println(s); } }"
    )
    assert main(["--out", str(tmp_path / "jfr"), "--", "java", str(source)]) == 0
    printed = capsys.readouterr().out
    assert (tmp_path / "jfr" / "analysis.jfr").exists()
    assert "execution samples:" in printed
    assert "of Spark's task threads 0" in printed  # no Spark here: no task thread
    compiled = printed.split("the JIT's compilations: ", 1)[1]
    assert int(compiled.split(",", 1)[0]) > 0  # a JVM compiles, even a small one
    assert " JDK" in compiled


def _sample(*methods: str) -> dict[str, object]:
    """A JFR execution sample whose stack is ``methods``, innermost first."""
    frames = []
    for qualified in methods:
        kind, name = qualified.rsplit(".", 1)
        frames.append({"method": {"type": {"name": f"org/x/{kind}"}, "name": name}})
    return {"values": {"stackTrace": {"frames": frames}}}


def test_the_call_paths_into_a_method_are_counted_from_its_innermost_call() -> None:
    samples = [
        _sample("A.equals", "Lower.exec", "Stage1.processNext", "Iterator.next"),
        _sample("Lower.exec", "Stage1.processNext", "Iterator.next"),
        _sample("A.equals", "Lower.exec", "Stage2.processNext"),
        _sample("A.equals", "Ordering.compare"),
        _sample("Lower.exec"),
    ]
    assert callers(samples, "Lower.exec", depth=2) == [
        (2, "Stage1.processNext < Iterator.next"),
        (1, "Stage2.processNext"),
        (1, ""),
    ]
    assert callers(samples, "A.equals", depth=1, top=1) == [(2, "Lower.exec")]
    assert callers(samples, "Nowhere.run") == []
