"""Waiting in tests: on a condition, with a deadline, failing with what was awaited.

No fixed sleeps: :func:`wait_until` returns as soon as its condition holds, checking it again
every ``poll`` seconds meanwhile. A node process counts as serving once its status file
(``status_file`` in its config; the node writes it after its first round, then every second)
carries the process's pid and ``"running": true``: a fact the process wrote, not a line of
its log to search.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

POLL_SECONDS = 0.02
"""How often a condition is checked again while it does not hold."""


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout: float = 60.0,
    *,
    check: Callable[[], None] | None = None,
    explain: Callable[[], str] | None = None,
    poll: float = POLL_SECONDS,
) -> None:
    """Return once ``condition()`` holds; raise AssertionError naming ``what`` after ``timeout``.

    ``check`` runs before each new look and may fail at once (a process that died);
    ``explain`` adds what was last seen to the timeout's message.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            seen = f"; last seen: {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{seen}")
        time.sleep(poll)


def serving(status_file: Path, process: subprocess.Popen[bytes]) -> bool:
    """Whether node process ``process`` wrote ``status_file`` as running (it has started).

    By then it holds the lease, restored its flows, consumes and published its node info.
    """
    try:
        status = json.loads(status_file.read_text())
    except (OSError, ValueError):  # not written yet (written whole: never half a document)
        return False
    return bool(status.get("pid") == process.pid and status.get("running") is True)


def still_running(process: subprocess.Popen[bytes], log: Path) -> Callable[[], None]:
    """A ``check`` for :func:`wait_until`: fail at once, with the log's end, if it exited."""

    def check() -> None:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            raise AssertionError(f"the process exited with {process.returncode}:\n{tail}")

    return check
