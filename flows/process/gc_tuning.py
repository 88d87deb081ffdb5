"""The garbage collector tuned for a node process: many long-lived objects, few cycles.

A node holds every waiting flow's state in memory (frozen values, persistent vectors,
greenlets); with CPython's default young-generation threshold (700 allocations) the
collector runs thousands of times a second under load and each run walks young objects
that almost never form garbage cycles. Measured on 10,000 in-memory ping/pongs: 833 flows/s
with the defaults, 1,092 with a young threshold of 50,000 and the start-up objects frozen,
1,146 with the collector off (which a long-running process cannot afford: cycles do occur).

:func:`tune_collector` freezes what start-up built (modules, CorDapps, restored flows: moved
to the permanent generation, never walked again) and raises the young threshold. A node
process calls it once it has started; an application embedding a :class:`~flows.node.node.Node`
in its own process may call it too: it is a process-wide setting, so fiberflow never
changes it unasked.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

YOUNG_THRESHOLD = 50_000
"""Allocations (less deallocations) between young-generation collections."""


def tune_collector() -> None:
    """Collect once, freeze what exists, raise the young-generation threshold."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
