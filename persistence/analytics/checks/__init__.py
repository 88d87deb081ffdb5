"""The checks: one module each, registered in :data:`REGISTRY` in report order.

Each check is a function ``(snapshot, settings) -> CheckResult`` (a DataFrame of findings and
a :class:`~persistence.analytics.check_results.Verdict`). What a check reads of the
:class:`~persistence.analytics.snapshot.Snapshot`, and the screening it shares with the
others (:func:`~persistence.analytics.screening.screen`,
:func:`~persistence.analytics.candidates.candidate_snapshot`), are its only inputs.
``docs/analytics.md`` has the same table (a test holds them equal) and each check's rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import attrs

from persistence.analytics.check_results import CheckFunction, CheckResult, CheckSettings
from persistence.analytics.checks.checkpoint_blobs import checkpoint_blobs
from persistence.analytics.checks.checkpoint_costs import checkpoint_costs
from persistence.analytics.checks.exactly_once_audit import exactly_once_audit
from persistence.analytics.checks.failed_flows import failed_flows
from persistence.analytics.checks.flow_counts import flow_counts
from persistence.analytics.checks.flows_over_time import flows_over_time
from persistence.analytics.checks.node_integrity import node_integrity
from persistence.analytics.checks.session_consistency import session_consistency
from persistence.analytics.checks.session_ownership import session_ownership
from persistence.analytics.checks.stuck_flows import stuck_flows

if TYPE_CHECKING:
    from persistence.analytics.snapshot import Snapshot

__all__ = [
    "CHECKS",
    "CHECK_TITLES",
    "REGISTRY",
    "Check",
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


@attrs.frozen
class Check:
    """One check: its name, what it finds, its worst verdict, whether it needs a key."""

    name: str
    title: str
    """A short lower-case name for progress lines."""
    finds: str
    worst: str
    """The worst verdict it gives: ``info``, ``warn`` or ``fail``."""
    needs_key: bool
    """It judges only the nodes whose checkpoint key was given (``--key-file``)."""
    run: CheckFunction


REGISTRY: tuple[Check, ...] = (
    Check(
        "flow_counts",
        "flows by node, class and status",
        "flows by node, class and status",
        "info",
        False,
        flow_counts,
    ),
    Check(
        "flows_over_time",
        "flows per status over time",
        "flows per status over time",
        "info",
        False,
        flows_over_time,
    ),
    Check(
        "stuck_flows",
        "stuck flows",
        "flows suspended longer than `--stuck-after`",
        "warn",
        False,
        stuck_flows,
    ),
    Check(
        "session_consistency",
        "cross-node session consistency",
        "session ends without their counterpart",
        "fail",
        False,
        session_consistency,
    ),
    Check(
        "exactly_once_audit",
        "exactly-once audit",
        "dedup ids and outbox rows that break exactly-once",
        "fail",
        False,
        exactly_once_audit,
    ),
    Check(
        "node_integrity",
        "node integrity (rows, blobs, outcomes)",
        "a node's tables disagreeing about a flow",
        "fail",
        False,
        node_integrity,
    ),
    Check(
        "session_ownership",
        "session ownership of consumed messages",
        "messages consumed in a session end the node does not hold",
        "fail",
        False,
        session_ownership,
    ),
    Check(
        "checkpoint_blobs",
        "checkpoint blobs (with the node's key)",
        "what only the checkpoint blob shows",
        "fail",
        True,
        checkpoint_blobs,
    ),
    Check(
        "checkpoint_costs",
        "checkpoint size and journal length",
        "checkpoint size and journal length by class",
        "info",
        False,
        checkpoint_costs,
    ),
    Check(
        "failed_flows",
        "hospitalized and failed flows",
        "flows in the hospital and failed flows",
        "warn",
        False,
        failed_flows,
    ),
)
"""Every check, in report order."""

CHECKS: tuple[tuple[str, CheckFunction], ...] = tuple((c.name, c.run) for c in REGISTRY)
"""``(name, function)`` of every check in :data:`REGISTRY`, in report order: what runs."""

CHECK_TITLES = {check.name: check.title for check in REGISTRY}
"""Each check's short lower-case name for progress lines."""


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
