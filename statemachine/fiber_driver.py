"""Running a flow's fiber one step and turning what it did into the flow's next event.

The scheduler (:mod:`statemachine.manager`) decides when a flow's fiber runs (its
continuation says so); :class:`FiberDriver` runs it: it creates the fiber the first time
(from the flow's origin, or the instance a local start built), resumes it with a value or
throws an error into it, and returns the event that describes the outcome (``Suspend``,
``FlowFinished`` or ``FlowFailed``) for the transition function.
"""

from __future__ import annotations

from statemachine.events import Event, FlowFailed, FlowFinished, Suspend
from statemachine.executor import BoundaryHook
from statemachine.flow_table import FlowRuntime
from statemachine.ports import Clock, Failed, FiberFactory, FiberOutcome, Returned, Suspended
from statemachine.result import Resume, Throw
from statemachine.state import FlowStatus


class FiberDriver:
    """Steps flows' fibers (see the module docstring)."""

    def __init__(
        self, fibers: FiberFactory, clock: Clock, on_boundary: BoundaryHook | None = None
    ) -> None:
        """``on_boundary`` is the crash tests' hook, told when a fiber suspends."""
        self._fibers = fibers
        self._clock = clock
        self._on_boundary = on_boundary

    def step(self, runtime: FlowRuntime, continuation: Resume | Throw) -> Event:
        """Run ``runtime``'s fiber until it suspends, returns or fails; returns the event.

        A returned result is kept on the runtime (the flow's end reports it).
        """
        if runtime.fiber is None:
            runtime.fiber = self._fibers.create(
                runtime.flow_id, runtime.state.checkpoint.origin, runtime.instance
            )
            runtime.instance = None
        if isinstance(continuation, Resume):
            outcome = runtime.fiber.resume(continuation.value)
        else:
            outcome = runtime.fiber.throw(continuation.error)
        if isinstance(outcome, Returned):
            runtime.result = outcome.result
        elif isinstance(outcome, Failed):
            runtime.traceback = outcome.traceback
        if isinstance(outcome, Suspended) and self._on_boundary is not None:
            self._on_boundary("flow_suspended")
            if runtime.state.status is FlowStatus.REPLAYING:
                self._on_boundary("during_replay")
        return self._event_for(outcome)

    def _event_for(self, outcome: FiberOutcome) -> Event:
        """The event describing a fiber's outcome."""
        at = self._clock.now()
        if isinstance(outcome, Suspended):
            return Suspend(outcome.request, at)
        if isinstance(outcome, Returned):
            return FlowFinished(outcome.result, at)
        assert isinstance(outcome, Failed)
        return FlowFailed(outcome.error, at, outcome.traceback)
