"""Spark's classes shared between runs: a class-data-sharing archive of the driver JVM.

A Spark driver loads, parses and verifies some twenty thousand classes before and while it
runs the checks: on a small machine several seconds of every analysis (measured: starting a
session and running a first job took 11.0 and 6.7 s without, 6.4 and 3.8 s with an archive).
The JVM can keep them in a class-data-sharing archive (JDK 13+, ``-XX:ArchiveClassesAtExit``
writes one when the JVM exits, ``-XX:SharedArchiveFile`` maps it at start). So the first
session on a machine writes the archive, and every later one starts from it:

* the archive lives in ``$FIBERFLOW_CACHE_DIR`` (default ``$XDG_CACHE_HOME/fiberflow``, else
  ``~/.cache/fiberflow``), named after what it depends on: the Java runtime (its real path
  and modification time), PySpark's version and the jars on the class path. Anything else
  changed, the JVM refuses the archive itself and runs without it (no error);
* the JVM writes a new archive to a file of its own (``<name>.<pid>.tmp``), put in place
  only after that JVM exited (:func:`finish`), so two sessions at once never leave a torn
  archive, and a JVM killed midway leaves none;
* ``FIBERFLOW_SPARK_CLASS_ARCHIVE=off`` turns it off; so does a cache folder that cannot be
  written. The JVM's own messages about the archive are off (``-Xlog:cds*=off``).

On Java 25 and later the same file is the JVM's **ahead-of-time cache** instead (project
Leyden: JEP 483 and 515; ``-XX:AOTCache`` maps it at start): besides the parsed classes it
keeps them loaded and linked, and the profiles of the methods the first run called, so that a
later JVM compiles its hot methods sooner. Its name ends in ``.aot``, and it depends on the
JVM's other options as well (a cache made under one garbage collector is refused under
another), which the name digests too. It is made in two steps: the first driver JVM records
what it loaded and ran (``-XX:AOTMode=record``) into a configuration file as it exits, then
:func:`finish` has another JVM, with the same class path and options, turn that into the
cache (``-XX:AOTMode=create``), its output captured: tens of seconds, once (measured on 10 M
rows: docs/analytics.md, *Benchmark*). (The JVM's one-step ``-XX:AOTCacheOutput`` starts that
second JVM itself, which prints the whole class path on the terminal.)
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import attrs

SWITCH = "FIBERFLOW_SPARK_CLASS_ARCHIVE"
"""The environment variable that turns the archive off (``off``, ``0``, ``no``)."""
CACHE_VARIABLE = "FIBERFLOW_CACHE_DIR"
"""The environment variable naming fiberflow's cache folder."""
QUIET = "-Xlog:cds*=off"
"""The JVM's messages about class sharing, off (classes it cannot archive, a stale archive)."""
AHEAD_OF_TIME_FROM = 25
"""The first Java release whose JVM keeps method profiles in its ahead-of-time cache
(JEP 515; JEP 483's cache of loaded classes came in Java 24)."""
CREATE_SECONDS = 600.0
"""The longest the JVM that makes an ahead-of-time cache may take (then none is made)."""
QUIET_AHEAD_OF_TIME = f"{QUIET} -Xlog:aot*=off"
"""The JVM's messages about class sharing and its ahead-of-time cache, off."""


@attrs.frozen
class ClassArchive:
    """The JVM options of one session's archive, and where a new one is written."""

    options: str
    """Options for ``spark.driver.extraJavaOptions``."""
    path: Path
    """The archive in the cache folder."""
    writing: Path | None
    """The file this JVM writes the archive to at exit (None: it reads an existing one)."""
    recording: Path | None = None
    """Java 25+: the configuration file the JVM records at exit, to make the cache from."""
    java_command: tuple[str, ...] = ()
    """Java 25+: the running driver JVM's ``java``, options and class path (see
    :func:`with_java_command`), which the JVM that makes the cache must share."""


def cache_folder() -> Path:
    """The cache folder of fiberflow (see the module docstring)."""
    chosen = os.environ.get(CACHE_VARIABLE)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fiberflow"


def java_binary() -> Path | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return (Path(home) / "bin" / "java").resolve()
    found = shutil.which("java")
    return Path(found).resolve() if found else None


def java_release(java: Path) -> int | None:
    """The feature release of the runtime ``java`` belongs to (17, 21, 25...), or None.

    Read from the runtime's ``release`` file (``JAVA_VERSION="25.0.2"``), beside ``bin``.
    """
    try:
        text = (java.parent.parent / "release").read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r'^JAVA_VERSION="(\d+)', text, re.MULTILINE)
    return int(found.group(1)) if found else None


def archive_name(
    java: Path,
    spark_version: str,
    jars: Sequence[Path],
    *,
    ahead_of_time: bool = False,
    jvm_options: str = "",
) -> str:
    """The archive's file name: a digest of the runtime, Spark's version, the jars and options.

    ``.aot`` for an ahead-of-time cache (Java 25 and later), ``.jsa`` for a class archive.
    """
    digest = hashlib.sha256()
    for part in [java, *sorted(Path(jar).resolve() for jar in jars)]:
        stat = part.stat()
        digest.update(f"{part}\0{stat.st_mtime_ns}\0{stat.st_size}\0".encode())
    digest.update(spark_version.encode())
    digest.update(f"\0{jvm_options}".encode())
    suffix = ".aot" if ahead_of_time else ".jsa"
    return f"spark-{spark_version}-{digest.hexdigest()[:16]}{suffix}"


def class_archive(jars: Sequence[Path] = (), jvm_options: str = "") -> ClassArchive | None:
    """The archive options of a new driver JVM, or None (turned off, or nowhere to keep it).

    ``jvm_options``: the driver's other JVM options (its collector, its JIT settings), which
    an ahead-of-time cache depends on.
    """
    if os.environ.get(SWITCH, "").strip().lower() in {"off", "0", "no", "false"}:
        return None
    java = java_binary()
    if java is None:
        return None
    import pyspark

    release = java_release(java)
    ahead = release is not None and release >= AHEAD_OF_TIME_FROM
    folder = cache_folder() / "spark-classes"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        name = archive_name(
            java, pyspark.__version__, jars, ahead_of_time=ahead, jvm_options=jvm_options
        )
        path = folder / name
    except OSError:
        return None
    if path.exists():
        if ahead:
            return ClassArchive(f"{QUIET_AHEAD_OF_TIME} -XX:AOTCache={path}", path, None)
        return ClassArchive(f"{QUIET} -XX:SharedArchiveFile={path}", path, None)
    if not os.access(folder, os.W_OK):
        return None
    writing = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    if ahead:
        recording = path.with_name(f"{path.name}.{os.getpid()}.aotconf")
        options = f"{QUIET_AHEAD_OF_TIME} -XX:AOTMode=record -XX:AOTConfiguration={recording}"
        return ClassArchive(options, path, writing, recording)
    return ClassArchive(f"{QUIET} -XX:ArchiveClassesAtExit={writing}", path, writing)


def with_java_command(
    archive: ClassArchive, java: str, options: Sequence[str], class_path: str
) -> ClassArchive:
    """``archive`` knowing the running driver JVM's ``java``, options and class path.

    For a JVM recording an ahead-of-time configuration: the JVM that makes the cache from
    it must run with the same class path and options (the recording's own left out).
    """
    if archive.recording is None:
        return archive
    kept = tuple(
        option
        for option in options
        if not option.startswith(("-XX:AOTMode=", "-XX:AOTConfiguration=", "-XX:AOTCache"))
    )
    return attrs.evolve(archive, java_command=(java, *kept, "-cp", class_path))


def discard(archive: ClassArchive | None) -> None:
    """After the JVM was killed: remove what it may have begun writing (nothing is kept)."""
    if archive is None:
        return
    for path in (archive.writing, archive.recording):
        if path is not None:
            path.unlink(missing_ok=True)


def finish(archive: ClassArchive | None) -> None:
    """After the JVM exited: put the archive it wrote in place (if it wrote one).

    On Java 25+, first make the ahead-of-time cache from the configuration the JVM recorded
    (:func:`make_cache`).
    """
    if archive is None or archive.writing is None:
        return
    if archive.recording is not None:
        make_cache(archive)
    try:
        if archive.writing.exists() and archive.writing.stat().st_size > 0:
            os.replace(archive.writing, archive.path)
        else:
            archive.writing.unlink(missing_ok=True)
    except OSError:
        archive.writing.unlink(missing_ok=True)


def make_cache(archive: ClassArchive) -> None:
    """Make the ahead-of-time cache at ``archive.writing`` from the recorded configuration.

    A JVM with the recording JVM's class path and options, ``-XX:AOTMode=create``; what it
    prints is captured (nothing reaches the terminal). The configuration is removed whatever
    happens; a cache that could not be made is simply not there (the next run records again).
    """
    recording, writing = archive.recording, archive.writing
    if recording is None or writing is None:
        return
    try:
        if archive.java_command and recording.exists() and recording.stat().st_size > 0:
            java, *rest = archive.java_command
            made = subprocess.run(
                [
                    java,
                    "-XX:AOTMode=create",
                    f"-XX:AOTConfiguration={recording}",
                    f"-XX:AOTCache={writing}",
                    *rest,
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=CREATE_SECONDS,
                check=False,
                env={k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"},
            )
            if made.returncode != 0:  # what it left is not a whole cache
                writing.unlink(missing_ok=True)
    except (OSError, subprocess.SubprocessError):
        writing.unlink(missing_ok=True)
    finally:
        recording.unlink(missing_ok=True)
