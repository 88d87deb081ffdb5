"""The metrics a node exposes, by name: the ones its hooks update (:class:`NodeFamilies`).

Counters by flow class and histograms are ``prometheus_client`` objects in the node's own
registry, updated by the hooks on the node's thread (:mod:`flows.metrics.probe`). The
labelled children are kept in a dict by class so that counting a flow's end is one dict
lookup and one increment. Gauges and the message counters are read at each scrape instead
(:mod:`flows.metrics.collector`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

COMMIT_SECONDS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
"""Buckets of ``fiberflow_checkpoint_commit_seconds`` (a SQLite FULL commit is ~1 ms)."""
CHECKPOINT_BYTES_BUCKETS = (
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
)
"""Buckets of ``fiberflow_checkpoint_size_bytes`` (up to the default 16 MiB payload limit)."""
REPLAY_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0)
"""Buckets of ``fiberflow_replay_seconds``."""

END_KINDS = ("finished", "failed", "killed")
"""How a flow ends, each with its counter ``fiberflow_flows_<kind>_total``."""


class NodeFamilies:
    """The counters and histograms of one node's registry (updated on the node's thread)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        """Register every counter and histogram in ``registry``."""
        label = ("flow_class",)
        self.flows_started = Counter(
            "fiberflow_flows_started",
            "Flows started on this node (local starts, requests, schedules, responders).",
            label,
            registry=registry,
        )
        self.flows_ended = {
            kind: Counter(
                f"fiberflow_flows_{kind}",
                f"Flows that ended {kind} on this node.",
                label,
                registry=registry,
            )
            for kind in END_KINDS
        }
        self.commit_seconds = Histogram(
            "fiberflow_checkpoint_commit_seconds",
            "Time of a state machine transaction, from begin to the end of its commit.",
            buckets=COMMIT_SECONDS_BUCKETS,
            registry=registry,
        )
        self.checkpoint_bytes = Histogram(
            "fiberflow_checkpoint_size_bytes",
            "Size of each checkpoint blob committed.",
            buckets=CHECKPOINT_BYTES_BUCKETS,
            registry=registry,
        )
        self.replay_seconds = Histogram(
            "fiberflow_replay_seconds",
            "Time from reading a flow's checkpoint to the end of its replay.",
            buckets=REPLAY_SECONDS_BUCKETS,
            registry=registry,
        )
        self._started: dict[str, Counter] = {}
        self._ended: dict[tuple[str, str], Counter] = {}

    def started(self, flow_class: str) -> None:
        """Count a flow of ``flow_class`` started."""
        child = self._started.get(flow_class)
        if child is None:
            child = self._started[flow_class] = self.flows_started.labels(flow_class)
        child.inc()

    def ended(self, kind: str, flow_class: str) -> None:
        """Count a flow of ``flow_class`` that ended ``kind`` (one of :data:`END_KINDS`)."""
        key = (kind, flow_class)
        child = self._ended.get(key)
        if child is None:
            child = self._ended[key] = self.flows_ended[kind].labels(flow_class)
        child.inc()
