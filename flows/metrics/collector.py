"""The metrics read at each scrape: flow counts, message counters, the outbox, readiness.

:class:`SnapshotCollector` answers from the node's latest :class:`~flows.metrics.probe.
NodeSnapshot` (taken on the node's thread) and reads the outbox's depth and oldest row with
one query of its own. The message counters keep counting across the node being rebuilt (a
node process rebuilds its node after a node-wide failure): what the replaced node had
counted is carried in a base added to the current node's counts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from flows.metrics.probe import NodeProbe

log = logging.getLogger("fiberflow.metrics")

MESSAGE_COUNTERS = (
    ("fiberflow_messages_received", "Session messages received (before dedup)."),
    ("fiberflow_messages_sent", "Session messages handed to the transport (outbox rows sent)."),
    ("fiberflow_messages_duplicate", "Received messages dropped as already consumed."),
    ("fiberflow_messages_dead_lettered", "Received messages put in the dead-letter table."),
)
"""The message counters, in the order of ``NodeSnapshot.counters()``."""


class SnapshotCollector(Collector):
    """Gauges and message counters of the node a probe watches (see the module docstring)."""

    def __init__(self) -> None:
        """Read no node until :meth:`follow` names one."""
        self._watched: tuple[NodeProbe | None, tuple[int, int, int, int]] = (None, (0, 0, 0, 0))
        """The probe of the node read now, and what replaced nodes had counted (received,
        sent, duplicates, dead-lettered): one value, replaced whole, so that a scrape on
        another thread never adds the old node's counts twice or leaves them out."""

    @property
    def probe(self) -> NodeProbe | None:
        """The probe of the node the metrics read now (None before the first node)."""
        return self._watched[0]

    @property
    def base(self) -> tuple[int, int, int, int]:
        """What replaced nodes had counted (received, sent, duplicates, dead-lettered)."""
        return self._watched[1]

    def follow(self, probe: NodeProbe, carried: tuple[int, int, int, int] = (0, 0, 0, 0)) -> None:
        """Read ``probe``'s node from now on.

        Its predecessor's final ``carried`` counters are added to the base in the same step.
        """
        base = self._watched[1]
        total = (
            base[0] + carried[0],
            base[1] + carried[1],
            base[2] + carried[2],
            base[3] + carried[3],
        )
        self._watched = (probe, total)

    def collect(self) -> Iterator[Metric]:
        """The metric families, as the node showed them at its latest snapshot."""
        probe, base_counters = self._watched
        snapshot = None if probe is None else probe.snapshot
        node = None if probe is None else probe.node
        gauges = (
            ("fiberflow_flows_live", "Unfinished flows on this node (in memory or hibernated)."),
            ("fiberflow_flows_hibernated", "Live flows with only their id in memory."),
            ("fiberflow_flows_hospitalized", "Flows kept in the hospital for an operator."),
            ("fiberflow_flows_paused", "Flows paused by an operator."),
        )
        values = (0, 0, 0, 0)
        counters = (0, 0, 0, 0)
        if snapshot is not None:
            values = (snapshot.live, snapshot.hibernated, snapshot.hospitalized, snapshot.paused)
            counters = snapshot.counters()
        for (name, documentation), value in zip(gauges, values, strict=True):
            yield GaugeMetricFamily(name, documentation, value=value)
        for (name, documentation), base, value in zip(
            MESSAGE_COUNTERS, base_counters, counters, strict=True
        ):
            yield CounterMetricFamily(name, documentation, value=base + value)
        depth, oldest = 0, None
        if node is not None:
            try:
                depth, oldest = node.database.outbox.depth()
            except Exception as error:  # the database is down: the gauges say nothing new
                log.debug("metrics: cannot read the outbox: %s", error)
        yield GaugeMetricFamily(
            "fiberflow_outbox_depth", "Rows in the node's outbox (not yet taken).", value=depth
        )
        yield GaugeMetricFamily(
            "fiberflow_outbox_oldest_age_seconds",
            "Age of the oldest outbox row (0 when the outbox is empty).",
            value=0.0 if oldest is None or node is None else max(0.0, node.clock.now() - oldest),
        )
        ready = 0
        if node is not None and not node.stopped:
            lease = node.lease
            ready = int(lease is None or lease.held)
        yield GaugeMetricFamily(
            "fiberflow_node_ready",
            "1 while the node serves and holds its lease (0 while it recovers or stopped).",
            value=ready,
        )
        yield GaugeMetricFamily(
            "fiberflow_metrics_snapshot_timestamp_seconds",
            "When the node last copied its counts for the metrics (time of day).",
            value=0.0 if probe is None else probe.snapshot_at,
        )
