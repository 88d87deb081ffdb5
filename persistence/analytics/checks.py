"""The checks, in report order, and how to run them.

Each check is a function of a :class:`~persistence.analytics.snapshot.Snapshot` that returns
a :class:`~persistence.analytics.check_results.CheckResult` (a DataFrame of findings and a
verdict), documented in ``docs/analytics.md`` with what it reads and why a finding matters.
They live by family:

* :mod:`persistence.analytics.inventory`: ``flow_counts``, ``flows_over_time``,
  ``checkpoint_costs``, ``failed_flows``;
* :mod:`persistence.analytics.stuck`: ``stuck_flows``;
* :mod:`persistence.analytics.consistency`: ``session_consistency``;
* :mod:`persistence.analytics.exactly_once`: ``exactly_once_audit``;
* :mod:`persistence.analytics.integrity`: ``node_integrity``;
* :mod:`persistence.analytics.ownership`: ``session_ownership``;
* :mod:`persistence.analytics.blobs`: ``checkpoint_blobs`` (with the nodes' keys).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from persistence.analytics.blobs import checkpoint_blobs
from persistence.analytics.check_results import CheckFunction, CheckResult, CheckSettings
from persistence.analytics.consistency import session_consistency
from persistence.analytics.exactly_once import exactly_once_audit
from persistence.analytics.integrity import node_integrity
from persistence.analytics.inventory import (
    checkpoint_costs,
    failed_flows,
    flow_counts,
    flows_over_time,
)
from persistence.analytics.ownership import session_ownership
from persistence.analytics.stuck import stuck_flows

if TYPE_CHECKING:
    from persistence.analytics.snapshot import Snapshot

__all__ = [
    "CHECKS",
    "CHECK_TITLES",
    "checkpoint_blobs",
    "checkpoint_costs",
    "exactly_once_audit",
    "failed_flows",
    "flow_counts",
    "flows_over_time",
    "node_integrity",
    "run_checks",
    "session_consistency",
    "session_ownership",
    "stuck_flows",
]

CHECKS: tuple[tuple[str, CheckFunction], ...] = (
    ("flow_counts", flow_counts),
    ("flows_over_time", flows_over_time),
    ("stuck_flows", stuck_flows),
    ("session_consistency", session_consistency),
    ("exactly_once_audit", exactly_once_audit),
    ("node_integrity", node_integrity),
    ("session_ownership", session_ownership),
    ("checkpoint_blobs", checkpoint_blobs),
    ("checkpoint_costs", checkpoint_costs),
    ("failed_flows", failed_flows),
)
"""Every check, in report order."""

CHECK_TITLES = {
    "flow_counts": "flows by node, class and status",
    "flows_over_time": "flows per status over time",
    "stuck_flows": "stuck flows",
    "session_consistency": "cross-node session consistency",
    "exactly_once_audit": "exactly-once audit",
    "node_integrity": "node integrity (rows, blobs, outcomes)",
    "session_ownership": "session ownership of consumed messages",
    "checkpoint_blobs": "checkpoint blobs (with the node's key)",
    "checkpoint_costs": "checkpoint size and journal length",
    "failed_flows": "hospitalized and failed flows",
}
"""Short lower-case names for progress lines."""


def run_checks(
    snapshot: Snapshot,
    settings: CheckSettings | None = None,
    names: Sequence[str] | None = None,
    on_check: Callable[[int, int, str], None] | None = None,
) -> list[CheckResult]:
    """Run the checks (all, or those ``names``) in report order.

    ``on_check(index, total, name)`` is called before each (for a progress display).
    """
    settings = settings or CheckSettings()
    chosen = [(name, check) for name, check in CHECKS if names is None or name in names]
    unknown = set(names or ()) - {name for name, _ in CHECKS}
    if unknown:
        raise ValueError(f"unknown checks: {sorted(unknown)}")
    results = []
    for index, (name, check) in enumerate(chosen, start=1):
        if on_check is not None:
            on_check(index, len(chosen), name)
        results.append(check(snapshot, settings))
    return results
