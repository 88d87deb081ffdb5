"""The driver JVM's class archive: written once by a JVM that exits, then read, never torn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from persistence.analytics import class_archive
from persistence.analytics.class_archive import (
    CACHE_VARIABLE,
    SWITCH,
    archive_name,
    finish,
)
from tests.conftest import require_service, spark_test_problem


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.delenv(SWITCH, raising=False)
    return tmp_path / "cache" / "spark-classes"


def test_a_first_jvm_writes_its_own_file_and_a_later_one_reads_the_archive(cache: Path) -> None:
    if class_archive.java_binary() is None:
        pytest.skip("no Java runtime")
    first = class_archive.class_archive()
    assert first is not None and first.writing is not None
    assert first.writing.parent == cache and str(os.getpid()) in first.writing.name
    assert f"-XX:ArchiveClassesAtExit={first.writing}" in first.options
    assert "-Xlog:cds*=off" in first.options
    first.writing.write_bytes(b"an archive")  # what the JVM writes as it exits
    finish(first)
    assert first.path.read_bytes() == b"an archive" and not first.writing.exists()
    later = class_archive.class_archive()
    assert later is not None and later.writing is None and later.path == first.path
    assert f"-XX:SharedArchiveFile={first.path}" in later.options


def test_nothing_written_or_an_empty_file_is_not_put_in_place(cache: Path) -> None:
    if class_archive.java_binary() is None:
        pytest.skip("no Java runtime")
    killed = class_archive.class_archive()
    assert killed is not None and killed.writing is not None
    finish(killed)  # the JVM wrote nothing
    assert not killed.path.exists()
    empty = class_archive.class_archive()
    assert empty is not None and empty.writing is not None
    empty.writing.write_bytes(b"")
    finish(empty)
    assert not empty.path.exists() and not empty.writing.exists()


def test_it_can_be_turned_off_and_needs_a_folder_it_can_write(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SWITCH, "off")
    assert class_archive.class_archive() is None
    monkeypatch.delenv(SWITCH)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(CACHE_VARIABLE, str(blocked))
    assert class_archive.class_archive() is None


def test_the_name_changes_with_the_runtime_the_jars_and_sparks_version(tmp_path: Path) -> None:
    java, jar = tmp_path / "java", tmp_path / "driver.jar"
    java.write_text("a runtime")
    jar.write_text("a jar")
    name = archive_name(java, "4.3.0", [jar])
    assert name == archive_name(java, "4.3.0", [jar])
    assert name != archive_name(java, "4.3.1", [jar])
    assert name != archive_name(java, "4.3.0", [])
    jar.write_text("another jar, of another size")
    assert name != archive_name(java, "4.3.0", [jar])


SESSION = """
import json, sys
from persistence.analytics.session import spark_session, stop_spark
spark = spark_session("local[1]")
jvm = spark.sparkContext._jvm
arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
assert spark.range(10).count() == 10
stop_spark(spark)
print(json.dumps([a for a in arguments if "Archive" in a]))
"""


@pytest.mark.spark
def test_a_real_driver_jvm_writes_the_archive_at_exit_and_the_next_one_starts_from_it(
    tmp_path: Path,
) -> None:
    """Two Spark sessions in two processes: the first leaves the archive, the second maps it."""
    require_service("Spark", spark_test_problem())
    environment = {**os.environ, CACHE_VARIABLE: str(tmp_path / "cache")}
    environment.pop(SWITCH, None)
    root = Path(__file__).resolve().parent.parent

    def session() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", SESSION],
            cwd=root,
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "[cds" not in done.stderr, done.stderr[-3000:]  # the JVM kept quiet
        options: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
        return options

    folder = tmp_path / "cache" / "spark-classes"
    written = session()
    assert any(option.startswith("-XX:ArchiveClassesAtExit=") for option in written)
    archives = list(folder.iterdir())
    assert [path.suffix for path in archives] == [".jsa"] and archives[0].stat().st_size > 0
    read = session()
    assert read == [f"-XX:SharedArchiveFile={archives[0]}"]
    assert list(folder.iterdir()) == archives  # nothing written again
