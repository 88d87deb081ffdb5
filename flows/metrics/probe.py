"""The hooks one node runs for its metrics (:class:`NodeProbe`), all on the node's thread.

A probe is the node's :class:`~flows.node.instruments.NodeInstruments`. It wraps the checkpoint
store the state machine uses so that each transaction is timed from ``begin`` to the end of
``commit`` (the commit latency histogram), and what the transaction wrote is counted only
once it committed: the checkpoints' sizes, and the flows started on this node (each local
start writes its ``UNSTARTED`` checkpoint exactly once). A responder is counted as started
when its fiber is first created (its checkpoint was never committed: version 0).

Replay time runs from the store reading a flow's checkpoint (a restore, a wake-up after
hibernation) to the end of the last fiber step the flow took while its status was
``REPLAYING``: the fiber of such a flow is wrapped, and before each later step (and after
each round, for a flow that waits) the probe looks whether the replay is over.

Every ``snapshot_seconds`` (after a round) the probe also copies what the gauges and the
message counters show into a :class:`NodeSnapshot`, which a scrape on another thread reads:
the node's flow table is never read from the scraping thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from flows.metrics.families import NodeFamilies
from statemachine.flow_end import FlowEnd
from statemachine.ports import CheckpointStore, Fiber, FiberFactory, FiberOutcome, StoreTransaction
from statemachine.state import Checkpoint, FlowOrigin, FlowStatus, InitiatedBy, StoredFlow
from statemachine.transition import FLOW_KILLED_EXCEPTION

if TYPE_CHECKING:
    from flows.node.node import Node
    from statemachine.flow_error import FlowError


@attrs.frozen
class NodeSnapshot:
    """What a node's gauges and message counters showed at one moment (node thread)."""

    live: int = 0
    hibernated: int = 0
    hospitalized: int = 0
    paused: int = 0
    messages_received: int = 0
    messages_sent: int = 0
    duplicates: int = 0
    dead_lettered: int = 0

    def counters(self) -> tuple[int, int, int, int]:
        """The message counters: received, sent, duplicates dropped, dead-lettered."""
        return (self.messages_received, self.messages_sent, self.duplicates, self.dead_lettered)


def end_kind(error: FlowError | None) -> str:
    """``finished``, ``killed`` or ``failed``: which counter a flow's end goes to."""
    if error is None:
        return "finished"
    return "killed" if error.exception_class == FLOW_KILLED_EXCEPTION else "failed"


class NodeProbe:
    """One node's metric hooks (see the module docstring); made by ``NodeMetrics``."""

    def __init__(
        self,
        families: NodeFamilies,
        snapshot_seconds: float,
        on_bind: Callable[[NodeProbe], None],
    ) -> None:
        """Hooks feeding ``families``; ``on_bind`` is told when the node is built."""
        self._families = families
        self._snapshot_seconds = snapshot_seconds
        self._on_bind = on_bind
        self.node: Node | None = None
        self.snapshot = NodeSnapshot()
        """The latest copy of the node's counts (replaced whole: safe to read anywhere)."""
        self.snapshot_at = 0.0
        """When :attr:`snapshot` was taken (seconds since the epoch)."""
        self._next_snapshot = 0.0
        self._durable = False
        self._sizes: list[int] = []
        self._started: list[str] = []
        self._loaded: dict[str, float] = {}
        """Flows whose checkpoints were read, by when, until their fibers are created."""
        self._replaying: dict[str, ReplayFiber] = {}

    # --- NodeInstruments ------------------------------------------------------------------

    def checkpoint_store(self, store: CheckpointStore) -> CheckpointStore:
        """``store``, with its transactions timed and its reads of checkpoints noted."""
        return TimedStore(store, self)

    def fibers(self, factory: FiberFactory) -> FiberFactory:
        """``factory``, counting responders started and timing replays."""
        return ObservedFibers(factory, self)

    def bind(self, node: Node) -> None:
        """Listen to the node's flow ends and checkpoint writes; take a first snapshot."""
        self.node = node
        self._durable = node.database.durable
        node.add_end_listener(self._flow_ended)
        node.database.checkpoints.checkpoint_listeners.append(self._checkpoint_written)
        self.take_snapshot()
        self._on_bind(self)

    def after_round(self) -> None:
        """Check flows that may have finished replaying; refresh the snapshot when due."""
        if self._replaying or self._loaded:
            self._check_replays()
        if self._snapshot_seconds <= 0 or time.monotonic() >= self._next_snapshot:
            self.take_snapshot()

    # --- what the node reports ------------------------------------------------------------

    def take_snapshot(self) -> None:
        """Copy the node's counts now (on the node's thread)."""
        node = self.node
        if node is None:
            return
        self._next_snapshot = time.monotonic() + self._snapshot_seconds
        manager = node.manager
        counts = manager.flow_counts()
        statistics = manager.statistics
        self.snapshot = NodeSnapshot(
            live=counts.live,
            hibernated=counts.dormant,
            hospitalized=sum(
                1 for state in manager.live_flows() if state.status is FlowStatus.HOSPITALIZED
            ),
            paused=len(manager.controls.paused()),
            messages_received=statistics.messages_received,
            messages_sent=node.relay.handed_off,
            duplicates=statistics.duplicates_dropped,
            dead_lettered=statistics.dead_lettered,
        )
        self.snapshot_at = time.time()

    def final_counters(self) -> tuple[int, int, int, int]:
        """The message counters as they stand now (the node was stopped or replaced)."""
        self.take_snapshot()
        return self.snapshot.counters()

    def _flow_ended(self, end: FlowEnd) -> None:
        self._families.ended(end_kind(end.error), end.flow_class)
        self._loaded.pop(end.flow_id, None)
        self._replaying.pop(end.flow_id, None)

    def _checkpoint_written(self, checkpoint: Checkpoint, size: int) -> None:
        if self._durable:
            self._sizes.append(size)
        if checkpoint.status is FlowStatus.UNSTARTED:
            self._started.append(checkpoint.flow_class)

    # --- transactions ---------------------------------------------------------------------

    def transaction_begun(self) -> None:
        """A transaction began: what an earlier one left uncommitted is forgotten."""
        self._sizes.clear()
        self._started.clear()

    def transaction_committed(self, seconds: float) -> None:
        """The transaction committed after ``seconds``: count what it wrote."""
        families = self._families
        families.commit_seconds.observe(seconds)
        if self._sizes:
            for size in self._sizes:
                families.checkpoint_bytes.observe(size)
            self._sizes.clear()
        if self._started:
            for flow_class in self._started:
                families.started(flow_class)
            self._started.clear()

    # --- replays --------------------------------------------------------------------------

    def checkpoints_read(self, stored: Sequence[StoredFlow], at: float) -> None:
        """The store read these flows' checkpoints, starting at ``at`` (perf_counter)."""
        for flow in stored:
            if flow.checkpoint is not None:
                self._loaded[flow.flow_id] = at

    def fiber_created(self, flow_id: str, origin: FlowOrigin, fiber: Fiber) -> Fiber:
        """Count a new responder; wrap the fiber of a restored flow to time its replay."""
        loaded_at = self._loaded.pop(flow_id, None)
        if loaded_at is not None:
            replay = ReplayFiber(fiber, flow_id, loaded_at, self)
            self._replaying[flow_id] = replay
            return replay
        if isinstance(origin, InitiatedBy) and self.node is not None:
            state = self.node.manager.flow_state(flow_id)
            if state is not None and state.checkpoint.version == 0:
                self._families.started(origin.flow_class)
        return fiber

    def replay_over(self, flow_id: str) -> bool:
        """True unless ``flow_id`` is still replaying (also when it is gone or kept)."""
        node = self.node
        state = None if node is None else node.manager.flow_state(flow_id)
        return state is None or state.status is not FlowStatus.REPLAYING

    def replay_ended(self, replay: ReplayFiber) -> None:
        """A restored flow is back where its checkpoint left it."""
        replay.stop_watching()
        if self._replaying.pop(replay.flow_id, None) is None:
            return
        node = self.node
        state = None if node is None else node.manager.flow_state(replay.flow_id)
        if state is not None and state.status is FlowStatus.HOSPITALIZED:
            return  # replay diverged (or was refused): not a replay that finished
        self._families.replay_seconds.observe(replay.last_step_end - replay.loaded_at)

    def _check_replays(self) -> None:
        for replay in list(self._replaying.values()):
            if self.replay_over(replay.flow_id):
                self.replay_ended(replay)
        for flow_id in list(self._loaded):
            if self.replay_over(flow_id):
                del self._loaded[flow_id]  # kept in the hospital, or hibernated again


class TimedTransaction:
    """A store transaction whose commit is timed (everything else goes to the real one)."""

    def __init__(self, inner: StoreTransaction, probe: NodeProbe, began: float) -> None:
        """Wrap ``inner``, begun at ``began`` (``time.perf_counter``)."""
        self._inner = inner
        self._probe = probe
        self._began = began

    def commit(self) -> None:
        """Commit; then report the time since ``begin`` and what was written."""
        self._inner.commit()
        self._probe.transaction_committed(time.perf_counter() - self._began)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TimedStore:
    """The state machine's checkpoint store, with timed transactions and noted reads."""

    def __init__(self, inner: CheckpointStore, probe: NodeProbe) -> None:
        """Wrap ``inner`` for ``probe``."""
        self._inner = inner
        self._probe = probe

    def begin(self) -> StoreTransaction:
        """Open a transaction of the real store, timed from now."""
        began = time.perf_counter()
        self._probe.transaction_begun()
        return TimedTransaction(self._inner.begin(), self._probe, began)

    def load_checkpoints(self, flow_ids: Sequence[str] | None = None) -> list[StoredFlow]:
        """The real store's answer; the flows read start their replay clocks."""
        began = time.perf_counter()
        stored = self._inner.load_checkpoints(flow_ids)
        self._probe.checkpoints_read(stored, began)
        return stored

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ObservedFibers:
    """The node's fiber factory, telling the probe about each fiber it creates."""

    def __init__(self, inner: FiberFactory, probe: NodeProbe) -> None:
        """Wrap ``inner`` for ``probe``."""
        self._inner = inner
        self._probe = probe

    def create(self, flow_id: str, origin: FlowOrigin, instance: object | None) -> Fiber:
        """The real factory's fiber (wrapped while the flow replays)."""
        fiber = self._inner.create(flow_id, origin, instance)
        return self._probe.fiber_created(flow_id, origin, fiber)


class ReplayFiber:
    """The fiber of a restored flow, remembering when its last step ended until replay ends."""

    def __init__(self, inner: Fiber, flow_id: str, loaded_at: float, probe: NodeProbe) -> None:
        """Wrap ``inner``, the fiber of ``flow_id`` whose checkpoint was read at ``loaded_at``."""
        self._inner = inner
        self.flow_id = flow_id
        self.loaded_at = loaded_at
        self.last_step_end = loaded_at
        self._probe: NodeProbe | None = probe

    def stop_watching(self) -> None:
        """The replay is over: step the flow without looking any more."""
        self._probe = None

    def _before_step(self) -> None:
        probe = self._probe
        if probe is not None and probe.replay_over(self.flow_id):
            probe.replay_ended(self)

    def _after_step(self, outcome: FiberOutcome) -> FiberOutcome:
        if self._probe is not None:
            self.last_step_end = time.perf_counter()
        return outcome

    def resume(self, value: Any) -> FiberOutcome:
        """Resume the flow (see ``statemachine.ports.Fiber``)."""
        self._before_step()
        return self._after_step(self._inner.resume(value))

    def throw(self, error: FlowError) -> FiberOutcome:
        """Throw into the flow (see ``statemachine.ports.Fiber``)."""
        self._before_step()
        return self._after_step(self._inner.throw(error))

    def abort(self) -> None:
        """Discard the flow's fiber."""
        self._inner.abort()
