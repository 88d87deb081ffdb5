"""An operator's commands on live flows: pause, resume, keep in the hospital, retry, kill.

Each is a flag of the flow table (pause, resume) or an event of the transition table
(:class:`~statemachine.events.Hospitalize`, :class:`~statemachine.events.RetryFlow`,
:class:`~statemachine.events.KillFlow`): a command changes a flow only as its rules allow. A
command is for the flow as it is now: a dormant flow is restored first. A flow that is not
live here is a ``KeyError``.
"""

from __future__ import annotations

from typing import Protocol

from statemachine.dormancy import Dormancy
from statemachine.events import Event, Hospitalize, KillFlow, RetryFlow
from statemachine.executor import ActionExecutor
from statemachine.flow_error import FlowError
from statemachine.flow_table import FlowRuntime, FlowTable
from statemachine.intake import Intake
from statemachine.ports import Clock
from statemachine.result import Continuation
from statemachine.state import Checkpoint, FlowStatus
from statemachine.transition import transition


class Scheduling(Protocol):
    """What the commands ask of the scheduler (the state machine manager)."""

    def apply_now(self, runtime: FlowRuntime, event: Event) -> None:
        """Apply an event to a flow at once (committed now)."""

    def add_runtime(self, runtime: FlowRuntime) -> None:
        """Take a new runtime in."""

    def forget_runtime(self, flow_id: str, *, ended: bool) -> FlowRuntime | None:
        """Drop a flow's runtime (not its checkpoint)."""

    def set_continuation(self, runtime: FlowRuntime, continuation: Continuation) -> None:
        """Make ``continuation`` the flow's next step."""

    def resume_from_checkpoint(self, flow_id: str, keep: str | None = None) -> None:
        """Drop a flow's memory and restore it from its stored checkpoint."""


class OperatorControls:
    """The operators' commands on one manager's flows (see the module docstring)."""

    def __init__(
        self,
        *,
        flows: FlowTable,
        dormancy: Dormancy,
        clock: Clock,
        executor: ActionExecutor,
        intake: Intake,
        scheduling: Scheduling,
    ) -> None:
        self._flows = flows
        self._dormancy = dormancy
        self._clock = clock
        self._executor = executor
        self._intake = intake
        self._scheduling = scheduling

    def _live(self, flow_id: str) -> FlowRuntime:
        if self._flows.is_dormant(flow_id):
            self._dormancy.wake(flow_id)  # an operator's command is for the flow as it is now
        runtime = self._flows.get(flow_id)
        if runtime is None:
            raise KeyError(f"flow {flow_id} is not running here (finished, or never was)")
        return runtime

    def pause_flow(self, flow_id: str) -> None:
        """Stop running a live flow (its events wait) until :meth:`resume_flow`."""
        self._live(flow_id)
        self._flows.pause(flow_id)

    def resume_flow(self, flow_id: str) -> None:
        """Let a paused flow run again."""
        if not self._flows.is_paused(flow_id):
            raise KeyError(f"flow {flow_id} is not paused")
        self._flows.resume(flow_id)

    def paused(self) -> set[str]:
        """The flows paused now."""
        return self._flows.paused()

    def hospitalize(self, flow_id: str, error: FlowError) -> None:
        """Keep a live flow for observation (an operator retries or kills it); it does not run.

        Its row says HOSPITALIZED with the reason, at once.
        """
        self._scheduling.apply_now(self._live(flow_id), Hospitalize(error, self._clock.now()))

    def retry_flow(self, checkpoint: Checkpoint) -> None:
        """Take a hospitalized flow out of the hospital: replay it from ``checkpoint``.

        ``checkpoint`` is the flow's stored checkpoint, read again (the code, or the stored
        blob, may have been fixed since). If replay still fails, it is hospitalized again.
        """
        flow_id = checkpoint.flow_id
        if self._flows.is_dormant(flow_id):
            self._dormancy.wake(flow_id)
        runtime = self._flows.get(flow_id)
        if runtime is None or runtime.state.status is not FlowStatus.HOSPITALIZED:
            raise KeyError(f"flow {flow_id} is not in the hospital here")
        result = transition(runtime.state, RetryFlow(checkpoint, self._clock.now()))
        self._executor.execute([result.actions])
        self._scheduling.forget_runtime(flow_id, ended=False)
        fresh = FlowRuntime(result.state, events=runtime.events)
        self._intake.requeue(runtime.held.values())  # held for it: routed to it now
        self._intake.parking.forget_held(flow_id)  # its sessions release them
        self._scheduling.add_runtime(fresh)
        self._scheduling.set_continuation(fresh, result.continuation)
        if fresh.events:
            self._flows.mark_ready(flow_id)

    def kill_flow(self, flow_id: str, reason: str, error: FlowError | None = None) -> None:
        """End a live flow wherever it is (the next round does it); KeyError if not live.

        It ends with ``error``, or by default ``FlowKilledException`` with ``reason``.
        """
        runtime = self._live(flow_id)
        if runtime.retry_at is not None:
            # Waiting for a retry after a failure, its memory is ahead of its checkpoint:
            # the kill starts from the checkpoint.
            self._scheduling.resume_from_checkpoint(flow_id)
            if flow_id not in self._flows:
                return  # it never committed: nothing is left to kill
        self._flows.unpause(flow_id)  # a kill runs even if the flow was paused
        self._flows.queue_event(flow_id, KillFlow(reason, self._clock.now(), error))
