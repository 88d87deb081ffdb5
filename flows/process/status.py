"""What a node process says of itself: its statistics, a status file, a report line in the log.

The status file (the config's ``status_file``; a worker's beside it) is rewritten every
second while the node runs and once more when it stops; every ten seconds the process logs
how many flows it holds and what it did.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import attrs

from flows.config.runtime import RuntimeConfig
from flows.node.node import Node
from messaging.bridges import BridgeManager
from persistence.worker_process import WorkerInfo

log = logging.getLogger("fiberflow.runtime")


class ProcessStatus:
    """The statistics, status file and report of one node process."""

    def __init__(
        self,
        config: RuntimeConfig,
        worker_name: str | None,
        worker: WorkerInfo,
        started_at: float,
    ) -> None:
        self.config = config
        self.worker_name = worker_name
        self.worker = worker
        self.started_at = started_at

    def statistics(self, node: Node) -> dict[str, Any]:
        """The node's counters as a JSON-able dict."""
        stats = attrs.asdict(node.manager.statistics)
        counts = node.manager.flow_counts()
        stats.update(
            name=self.config.name,
            pid=os.getpid(),
            started_at=self.started_at,
            live_flows=counts.live,
            flows_in_memory=counts.in_memory,
            flows_dormant=counts.dormant,
            flows_restoring=counts.restoring,
            waiting_in_memory=counts.waiting_in_memory,
            checkpoints_written=node.database.checkpoints.checkpoints_written,
            messages_sent=node.relay.handed_off,
            relay_waiting=node.relay.waiting(),
            relay_refused=node.relay.refused,
            topology=self.config.topology,
            worker=self.worker_name,
            worker_id=self.worker.worker_id,
            partitions=None if node.partitions is None else sorted(node.partitions),
        )
        if isinstance(node.relay, BridgeManager):
            stats["bridges"] = [attrs.asdict(bridge) for bridge in node.relay.status()]
        return stats

    def report(self, node: Node) -> None:
        """Log what the node holds and did (every ten seconds while it runs)."""
        stats = self.statistics(node)
        if node.draining:
            log.info("%s: draining, %d flow(s) left", self.config.name, stats["live_flows"])
        log.info(
            "%s: %d live flows (%d hibernated or not restored yet), %d completed, %d failed; "
            "%d messages in, %d out; %d checkpoints written",
            self.config.name,
            stats["live_flows"],
            stats["flows_dormant"],
            stats["flows_completed"],
            stats["flows_failed"],
            stats["messages_received"],
            stats["messages_sent"],
            stats["checkpoints_written"],
        )

    @property
    def status_path(self) -> Path | None:
        """Where this process writes its status: the config's ``status_file``.

        A worker writes its own beside it, its name after the first part of the file's
        (``alice.status.json``: ``alice.w1.status.json``).
        """
        path = self.config.status_file
        if path is None or self.worker_name is None:
            return path
        return worker_status_path(path, self.worker_name)

    def write(self, node: Node, running: bool) -> None:
        """Rewrite the status file (if the config names one): the statistics and ``running``."""
        path = self.status_path
        if path is None:
            return
        stats = self.statistics(node)
        stats["running"] = running
        temporary = path.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps(stats, indent=2) + "\n")
            temporary.replace(path)
        except OSError as error:  # a full disk or a removed directory must not stop the node
            log.warning("%s: cannot write the status file %s: %s", self.config.name, path, error)


def worker_status_path(path: Path, worker: str) -> Path:
    """The status file of worker ``worker`` of a node whose config names ``path``."""
    head, dot, rest = path.name.partition(".")
    return path.with_name(f"{head}.{worker}{dot}{rest}")
