"""The counters a scheduler keeps (a node reports them; tests and benchmarks read them)."""

from __future__ import annotations

import attrs


@attrs.define
class ManagerStatistics:
    """Counters a node reports (and tests and benchmarks read)."""

    messages_received: int = 0
    duplicates_dropped: int = 0
    late_messages_dropped: int = 0
    dead_lettered: int = 0
    sessions_rejected: int = 0
    flows_started: int = 0
    flows_completed: int = 0
    flows_failed: int = 0
    flows_hospitalized: int = 0
    failures_pinned: int = 0
    """Failures pinned on one flow or one message (each resumed, kept, failed or quarantined)."""
    messages_quarantined: int = 0
    flows_restored: int = 0
    """Flows restored from their checkpoints (woken, or restored after the start)."""
    flows_woken: int = 0
    """Dormant flows restored because something arrived for them."""
    flows_hibernated: int = 0
    """Waiting flows that gave up their memory (:mod:`statemachine.hibernation`)."""


@attrs.frozen
class FlowCounts:
    """How many of a node's live flows are where (``StateMachineManager.flow_counts``)."""

    in_memory: int
    """Flows with their state (and fiber) in memory."""
    dormant: int
    """Flows with only their id in memory: hibernated, or not restored since the start."""
    restoring: int
    """Dormant flows queued for a background restore (they have something to do)."""
    waiting_in_memory: dict[str, int]
    """Suspended flows in memory by what they wait for (Receive, Sleep, RunOperation)."""

    @property
    def live(self) -> int:
        """Every unfinished flow: in memory or dormant."""
        return self.in_memory + self.dormant
