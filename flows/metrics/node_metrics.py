"""A node's Prometheus metrics: :class:`NodeMetrics`, owning its own registry.

One ``NodeMetrics`` follows one node across rebuilds: each :class:`~flows.node.node.Node` is
built with ``instruments=metrics.instruments()``, and the metrics read the latest node built
that way (a node process rebuilds its node after a node-wide failure; counters carry on).
Nothing here is process-wide: nodes sharing a process (the test network) each have their
own registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from flows.metrics.collector import SnapshotCollector
from flows.metrics.families import NodeFamilies
from flows.metrics.probe import NodeProbe

DEFAULT_SNAPSHOT_SECONDS = 1.0
"""How often (at most) a node copies its flow counts for the scrapes, after a round."""


class NodeMetrics:
    """The metrics of one node (see the module docstring and docs/operations.md)."""

    def __init__(self, snapshot_seconds: float = DEFAULT_SNAPSHOT_SECONDS) -> None:
        """Metrics in a registry of their own.

        The gauges show the node's counts as copied at most every ``snapshot_seconds`` (0:
        after every round, what tests want).
        """
        if snapshot_seconds < 0:
            raise ValueError(f"snapshot_seconds must be zero or positive, not {snapshot_seconds}")
        self.registry = CollectorRegistry()
        """The registry every metric of this node is in (scrape it, or serve it)."""
        self._snapshot_seconds = snapshot_seconds
        self._families = NodeFamilies(self.registry)
        self._collector = SnapshotCollector()
        self.registry.register(self._collector)

    def instruments(self) -> NodeProbe:
        """Hooks for the next node to build (``Node(..., instruments=...)``)."""
        return NodeProbe(self._families, self._snapshot_seconds, self._bound)

    def _bound(self, probe: NodeProbe) -> None:
        """A node was built with ``probe``: it replaces the one the metrics read.

        The replaced node's final counts are taken first, while the metrics still read it,
        then the new probe and the carried counts are put in place in one step: a scrape in
        between sees the counters neither drop nor jump.
        """
        old = self._collector.probe
        if old is probe:
            return
        carried = (0, 0, 0, 0) if old is None else old.final_counters()
        self._collector.follow(probe, carried)

    def refresh(self) -> None:
        """Copy the node's counts now (call it on the node's thread, between rounds)."""
        probe = self._collector.probe
        if probe is not None:
            probe.take_snapshot()

    def exposition(self) -> bytes:
        """Every metric in Prometheus's text format (what ``/metrics`` answers)."""
        return generate_latest(self.registry)
