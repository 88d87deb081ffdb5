"""The node of a process, kept running: started, rebuilt after a node-wide failure, rebalanced.

A failure pinned on one flow or one message never gets here: the manager treats it by the
flow hospital's rules while the node goes on. What reaches :meth:`NodeKeeper.recover` is a
node-wide failure (the database or the transport went away, a bug in the framework): the
node's memory is dropped and the node is built again from its last checkpoints, after the
hospital's backoff, and again, backing off, for as long as that fails.

For a worker of a node run by several workers, the lease keeper's thread reports partition
changes (:meth:`NodeKeeper.on_rebalance`); the serving loop carries them out
(:meth:`NodeKeeper.apply_rebalances`): the node is stopped (its flows stay checkpointed; the
transport gives back what it held unsettled), the partitions to hand over are released, and
the node is built again on the partitions the lease holds now. Flows of taken partitions are
restored lazily, as at any start.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable

from flows.node.hospital import Hospital
from flows.node.node import Node
from messaging.service import TransportAuthenticationError
from persistence.lease import LeaseLostError, NodeLease, Rebalance
from statemachine.partitions import partition_ranges

log = logging.getLogger("fiberflow.runtime")


class NodeKeeper:
    """Keeps one node process's node running (see the module docstring)."""

    def __init__(
        self,
        name: str,
        build: Callable[[], Node],
        hospital: Hospital,
        stop: threading.Event,
        on_lease_lost: Callable[[LeaseLostError], None],
        on_refused: Callable[[TransportAuthenticationError], None],
        worker_name: str | None = None,
    ) -> None:
        """A keeper of node ``name``'s node, made by ``build`` (built, not started).

        ``stop`` ends every wait; ``on_lease_lost`` and ``on_refused`` are told when a
        rebuild finds the lease lost or the transport refusing the node's login (retrying
        cannot help then).
        """
        self.name = name
        self.worker_name = worker_name
        self._build = build
        self.hospital = hospital
        self._stop = stop
        self._on_lease_lost = on_lease_lost
        self._on_refused = on_refused
        self.node: Node | None = None
        """The node now running (None before the first start)."""
        self.recoveries = 0
        """Node-wide failures: rounds that failed and were resumed from the last checkpoints
        (failures pinned on a flow or a message are counted by ``hospital.pinned``)."""
        self.last_failure = 0.0
        """``time.monotonic()`` of the last node-wide failure."""
        self._rebalances: queue.SimpleQueue[Rebalance] = queue.SimpleQueue()
        """Partition changes the lease keeper found, for the serving loop to carry out."""

    def start(self) -> Node:
        """Build the node and start it: flows restored, flows kept in the hospital kept."""
        node = self._build()
        self.node = node
        if self._stop.is_set():
            node.wakeup.set()
        try:
            node.start()
        except BaseException:
            with contextlib.suppress(Exception):  # what started must not leak
                node.stop()
            raise
        return node

    def recover(self, error: BaseException) -> None:
        """A node-wide failure: drop the node's memory, resume from the last checkpoints."""
        diagnosis = self.hospital.diagnose(error)
        delay = self.hospital.backoff_seconds()
        self.recoveries += 1
        self.last_failure = time.monotonic()
        level = logging.WARNING if diagnosis.rule == "transient" else logging.ERROR
        log.log(
            level,
            "%s: hospital rule %s (node-wide): %s; resuming every flow from its last "
            "checkpoint in %.2f s",
            self.name,
            diagnosis.rule,
            diagnosis.reason,
            delay,
            exc_info=diagnosis.rule == "unknown",
        )
        with contextlib.suppress(Exception):  # the database may be the thing that is down
            if self.node is not None:
                self.node.stop()
        if self._stop.wait(delay):
            return
        while not self._stop.is_set():
            try:
                self.start()
                return
            except LeaseLostError as lost:
                self._on_lease_lost(lost)
                return
            except TransportAuthenticationError as refused:
                self._on_refused(refused)
                return
            except Exception as rebuild_error:  # still down: keep trying, backing off
                self.hospital.diagnose(rebuild_error)
                delay = self.hospital.backoff_seconds()
                log.warning(
                    "%s: cannot resume yet (%s); next try in %.2f s",
                    self.name,
                    rebuild_error,
                    delay,
                )
                self._stop.wait(delay)

    def on_rebalance(self, change: Rebalance) -> None:
        """From the lease keeper's thread: the serving loop carries the change out."""
        self._rebalances.put(change)
        node = self.node
        if node is not None:
            node.wakeup.set()

    @property
    def rebalance_due(self) -> bool:
        """True when a partition change waits to be carried out."""
        return not self._rebalances.empty()

    def apply_rebalances(self, lease: NodeLease) -> None:
        """Carry out the partition changes the lease keeper found (on the serving thread)."""
        to_release: set[int] = set()
        while True:
            try:
                change = self._rebalances.get_nowait()
            except queue.Empty:
                break
            to_release |= change.to_release
        assert self.node is not None
        before = self.node.partitions or frozenset()
        self.node.stop()
        lease.release_partitions(to_release)
        after = self.start().partitions or frozenset()
        log.info(
            "%s: worker %r now runs partitions %s (handed over %s, took %s)",
            self.name,
            self.worker_name,
            partition_ranges(after),
            partition_ranges(before - after),
            partition_ranges(after - before),
        )
