"""The process's resident memory, as the operating system counts it (for the memory budget)."""

from __future__ import annotations

import os
import resource
import sys


def resident_bytes() -> int:
    """Bytes of this process's memory resident in RAM now.

    From ``/proc/self/statm`` where there is one (Linux); elsewhere the peak so far (the
    closest the standard library gets), which only overstates.
    """
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
