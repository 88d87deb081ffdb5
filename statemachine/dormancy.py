"""Dormant flows: restored lazily from their checkpoints, hibernated when they wait long enough.

A dormant flow has only its id in memory (:class:`~statemachine.flow_table.FlowTable`). At
start the manager reads an index of the stored checkpoints (rows, not blobs): a flow that
waits for a message or a timer stays dormant (its deadline is armed) until a message for one
of its sessions, its deadline or an operator's command arrives (:meth:`Dormancy.wake`); the
others are restored in the background, :data:`RESTORE_BATCH` a round, while new flows and
messages are served from the first round. A flow restored and replayed to the point its
checkpoint records writes nothing.

A waiting flow in memory becomes dormant again when the hibernation policy says so
(:mod:`statemachine.hibernation`): after it waited long enough, or at once for every waiting
flow while the node is over its memory budget. What it took in since its last commit is
committed first.

A restored flow the installed flows cannot resume (the compatibility check) is kept in the
hospital and listed in :attr:`Dormancy.incompatible`.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Container, Sequence

import attrs

from statemachine.actions import Action
from statemachine.events import Hibernate
from statemachine.executor import ActionExecutor
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.flow_table import FlowRuntime, FlowTable
from statemachine.hibernation import HibernationPolicy, IdleFlows, MemoryBudget, may_hibernate
from statemachine.isolation import Batch, FailureIsolation
from statemachine.partitions import partition_of
from statemachine.ports import CheckpointStore, Clock
from statemachine.state import Checkpoint, FlowStatus, StoredFlow
from statemachine.statistics import ManagerStatistics
from statemachine.timers import WakeUps
from statemachine.transition import transition

log = logging.getLogger("fiberflow.statemachine")

RESTORE_BATCH = 64
"""Flows restored in the background per round (one read of their checkpoints)."""

INCOMPATIBLE_CHECKPOINT = "flows.errors.IncompatibleCheckpointError"
"""The error class recorded for a flow the installed flows cannot resume (kept in the hospital)."""

Compatibility = Callable[[Checkpoint], "str | None"]
"""Why the installed flows cannot resume a checkpoint, or None if they can."""


class Dormancy:
    """The manager's dormant flows: their restore and their hibernation (module docstring)."""

    def __init__(
        self,
        *,
        our_identity: str,
        store: CheckpointStore,
        flows: FlowTable,
        wake_ups: WakeUps,
        executor: ActionExecutor,
        statistics: ManagerStatistics,
        clock: Clock,
        isolation: FailureIsolation | None,
        hibernation: HibernationPolicy | None,
        compatibility: Compatibility | None,
        load: Callable[[StoredFlow], tuple[Action, ...]],
        forget: Callable[[str], object],
        commit: Callable[[Batch], None],
        hospitalize: Callable[[str, FlowError], None],
    ) -> None:
        """The dormancy of the manager's flows; the callables are the manager's own.

        ``load`` makes a runtime of a stored flow (returning the actions to commit for it),
        ``forget`` drops a flow's runtime, ``commit`` commits a round's batch and
        ``hospitalize`` keeps a live flow in the hospital.
        """
        self.our_identity = our_identity
        self._store = store
        self._flows = flows
        self._wake_ups = wake_ups
        self._executor = executor
        self._statistics = statistics
        self._clock = clock
        self._isolation = isolation
        self._hibernation = hibernation if hibernation is not None and hibernation.enabled else None
        self._idle = IdleFlows()
        self._memory = None if hibernation is None else MemoryBudget(hibernation, clock.now)
        self._compatibility = compatibility
        self._load = load
        self._forget = forget
        self._commit = commit
        self._hospitalize = hospitalize
        self.incompatible: dict[str, str] = {}
        """Restored flows the installed flows cannot resume, with why (kept in the hospital)."""
        self._restore_queue: deque[str] = deque()

    # --- restoring ------------------------------------------------------------------------

    def restore(self, partitions: Container[int] | None = None) -> int:
        """Read the index of stored flows (not the flows); returns how many there are.

        A flow waiting for a message or a timer stays dormant until one comes (its deadline
        is armed now); the others are restored in the background, :data:`RESTORE_BATCH` a
        round, oldest first. With ``partitions`` (a worker of a node run by several workers),
        only the flows of those partitions.
        """
        index = self._store.checkpoint_index()
        if partitions is not None:
            index = [entry for entry in index if partition_of(entry.flow_id) in partitions]
        for entry in index:
            if self._flows.holds(entry.flow_id):
                continue
            self._flows.add_dormant(entry.flow_id)
            if not entry.waiting:
                self._restore_queue.append(entry.flow_id)
            elif entry.wake_at is not None:
                self._wake_ups.schedule(entry.flow_id, entry.wake_at)
        return len(index)

    def restore_all(self) -> int:
        """Restore every dormant flow now (tests, tools); returns how many were restored."""
        dormant = [*self._restore_queue]
        self._restore_queue.clear()
        dormant.extend(flow_id for flow_id in self._flows.dormant_ids() if flow_id not in dormant)
        return self.restore_now(dormant)

    def restore_now(self, flow_ids: Sequence[str]) -> int:
        """Restore these dormant flows from their checkpoints (one read); returns how many.

        The store reports what it found (a trusted checkpoint, or why not; what the flow's
        row says); the transition decides (:class:`~statemachine.events.LoadFlow`). With a
        failure policy, a checkpoint the state machine cannot restore keeps its flow in the
        hospital; the others are restored all the same. A flow the installed flows cannot
        resume is kept in the hospital.
        """
        taken = [flow_id for flow_id in flow_ids if self._flows.take_dormant(flow_id)]
        if not taken:
            return 0
        stored_flows = self._store.load_checkpoints(taken)
        actions: list[tuple[Action, ...]] = []
        for stored in stored_flows:
            try:
                actions.append(self._load(stored))
            except Exception as error:
                if self._isolation is None or self._isolation.is_node_wide(error):
                    raise
                actions.append(self._keep_unrestorable(stored, error))
        self._executor.execute(actions)
        self._statistics.flows_restored += len(stored_flows)
        if self._compatibility is not None:
            for stored in stored_flows:
                self._check_compatibility(stored.flow_id)
        return len(stored_flows)

    def _keep_unrestorable(self, stored: StoredFlow, error: Exception) -> tuple[Action, ...]:
        """Keep a flow whose checkpoint the state machine cannot restore (its row says why)."""
        self._forget(stored.flow_id)
        reason = f"its checkpoint cannot be restored: {type(error).__name__}: {error}"
        self._statistics.flows_hospitalized += 1
        return self._load(attrs.evolve(stored, checkpoint=None, problem=reason))

    def _check_compatibility(self, flow_id: str) -> None:
        """Keep a restored flow the installed flows cannot resume in the hospital."""
        assert self._compatibility is not None
        runtime = self._flows.get(flow_id)
        if runtime is None or runtime.state.status is FlowStatus.HOSPITALIZED:
            return
        problem = self._compatibility(runtime.state.checkpoint)
        if problem is None:
            return
        self.incompatible[flow_id] = problem
        log.error(
            "%s: flow %s cannot be resumed by the installed CorDapps and is kept in the "
            "hospital: %s",
            self.our_identity,
            flow_id,
            problem,
        )
        self._hospitalize(flow_id, FlowError(ErrorKind.INTERNAL, INCOMPATIBLE_CHECKPOINT, problem))

    def wake(self, flow_id: str) -> None:
        """Restore a dormant flow now: something arrived for it."""
        if self.restore_now([flow_id]):
            self._statistics.flows_woken += 1

    def restore_some(self) -> bool:
        """Restore the next batch of flows queued for a background restore; True if any."""
        batch: list[str] = []
        while self._restore_queue and len(batch) < RESTORE_BATCH:
            flow_id = self._restore_queue.popleft()
            if self._flows.is_dormant(flow_id):
                batch.append(flow_id)
        return self.restore_now(batch) > 0

    def restoring(self) -> int:
        """Flows still queued for a background restore."""
        return len(self._restore_queue)

    # --- hibernating ----------------------------------------------------------------------

    @property
    def hibernates(self) -> bool:
        """True if waiting flows may hibernate (a policy that is enabled)."""
        return self._hibernation is not None

    def note_status(self, runtime: FlowRuntime) -> None:
        """Keep the idle list up to date after a transition of ``runtime``."""
        if runtime.state.status is FlowStatus.SUSPENDED:
            self._idle.suspended(runtime.flow_id, self._clock.now())
        else:
            self._idle.discard(runtime.flow_id)

    def forget(self, flow_id: str) -> None:
        """``flow_id`` left memory (ended, failed, restored again): not idle any more."""
        self._idle.discard(flow_id)

    def hibernate_idle(self) -> None:
        """Hibernate the flows the policy says have waited long enough (after the commit)."""
        policy = self._hibernation
        if policy is None or not len(self._idle):
            return
        assert self._memory is not None
        if self._memory.over():
            cutoff = None
        elif policy.idle_seconds is None:
            return
        else:
            cutoff = self._clock.now() - policy.idle_seconds
        self.hibernate(self._idle.take_idle_since(cutoff))

    def hibernate(self, flow_ids: Sequence[str]) -> int:
        """Drop these waiting flows' memory, keeping only their ids; returns how many.

        Only flows that :func:`~statemachine.hibernation.may_hibernate` and are not paused
        or ready to run; what one took in since its last commit is committed first (one
        transaction for all). Their deadlines stay armed.
        """
        now = self._clock.now()
        chosen: list[FlowRuntime] = []
        batch: Batch = []
        for flow_id in flow_ids:
            runtime = self._flows.get(flow_id)
            if runtime is None or not may_hibernate(runtime, now):
                continue
            if self._flows.is_paused(flow_id) or self._flows.is_ready(flow_id):
                continue
            if runtime.state.is_dirty():
                result = transition(runtime.state, Hibernate(now))
                runtime.state = result.state
                batch.append((flow_id, result.actions))
            chosen.append(runtime)
        if batch:
            self._commit(batch)
        hibernated = 0
        for runtime in chosen:
            if self._flows.get(runtime.flow_id) is not runtime or runtime.state.is_dirty():
                continue  # its commit failed: it was restored from its checkpoint meanwhile
            self._flows.remove(runtime.flow_id, forget_pause=False)
            self._idle.discard(runtime.flow_id)
            if runtime.fiber is not None:
                runtime.fiber.abort()
                runtime.fiber = None
            self._flows.add_dormant(runtime.flow_id)
            hibernated += 1
        self._statistics.flows_hibernated += hibernated
        return hibernated
