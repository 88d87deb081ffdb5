"""The node process's collector tuning, checked in a fresh interpreter (it is process-wide)."""

from __future__ import annotations

import subprocess
import sys


def test_tune_collector_freezes_start_up_and_raises_the_young_threshold() -> None:
    script = (
        "import gc; from flows.process.gc_tuning import YOUNG_THRESHOLD, tune_collector; "
        "before = gc.get_threshold(); tune_collector(); after = gc.get_threshold(); "
        "assert after == (YOUNG_THRESHOLD, *before[1:]), (before, after); "
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count(); "
        "assert gc.isenabled(); print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "ok", done.stderr
