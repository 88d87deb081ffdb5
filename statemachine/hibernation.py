"""When a suspended flow gives up its memory (hibernates), and which flows may.

A flow that waits (for a counterparty, a timer) holds its fiber (a greenlet with its saved
stack), its state and its sessions in memory. Its checkpoint already says everything about
it, so the scheduler can drop all of that and keep only the flow's id (a *dormant* flow, see
:class:`~statemachine.flow_table.FlowTable`): a message for one of its sessions, its timer or
an operator's command restores it from the checkpoint, and replay brings it back to where it
waited, writing nothing. Flow code and counterparties cannot tell.

:class:`HibernationPolicy` says when: a flow suspended for ``idle_seconds`` (0: as soon as the
round that suspended it has committed), and every suspended flow while the process's resident
memory is over ``memory_budget_bytes``. :class:`IdleFlows` keeps the live suspended flows in
the order they suspended, so finding the idle ones costs O(flows hibernated), not O(flows).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import attrs

from statemachine.flow_table import FlowRuntime
from statemachine.iorequests import RunOperation
from statemachine.state import FlowStatus

MEMORY_CHECK_SECONDS = 1.0
"""How often (at most) the process's resident memory is read against the budget."""


def _optional_non_negative(_: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{attribute.name} must be a number of at least 0 or None, not {value!r}")


@attrs.frozen
class HibernationPolicy:
    """When suspended flows hibernate (see the module docstring); None turns a rule off."""

    idle_seconds: float | None = attrs.field(default=None, validator=_optional_non_negative)
    """A flow suspended this long hibernates (0: at the end of the round it suspended in)."""
    memory_budget_bytes: int | None = attrs.field(default=None, validator=_optional_non_negative)
    """While the process's resident memory is above this, every suspended flow hibernates."""
    resident_bytes: Callable[[], int] | None = attrs.field(default=None, eq=False)
    """Reads the process's resident memory (needed with a budget)."""

    def __attrs_post_init__(self) -> None:
        if self.memory_budget_bytes is not None and self.resident_bytes is None:
            raise ValueError("a memory budget needs resident_bytes to read the memory in use")

    @property
    def enabled(self) -> bool:
        """True if any rule can hibernate a flow."""
        return self.idle_seconds is not None or self.memory_budget_bytes is not None


def may_hibernate(runtime: FlowRuntime, now: float) -> bool:
    """True if the flow only waits, and its checkpoint can be all of it.

    It is suspended on a receive or a sleep (an external operation's attempt runs in a thread
    that reports to the flow in memory) whose deadline, if any, is still to come; no event or
    continuation waits for it, and it is not held for a retry after a failure. (What it
    took in since its last commit is committed first:
    :class:`~statemachine.events.Hibernate`.)
    """
    state = runtime.state
    pending = state.checkpoint.pending
    return (
        state.status is FlowStatus.SUSPENDED
        and pending is not None
        and not isinstance(pending.request, RunOperation)
        and (pending.deadline is None or pending.deadline > now)
        and runtime.continuation is None
        and not runtime.events
        and not runtime.holding
        and not runtime.held
        and runtime.retry_at is None
    )


class IdleFlows:
    """Live suspended flows by when they (last) suspended, oldest first."""

    def __init__(self) -> None:
        self._since: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._since)

    def suspended(self, flow_id: str, at: float) -> None:
        """``flow_id`` suspended (again) at ``at``: it is the newest now."""
        self._since[flow_id] = at
        self._since.move_to_end(flow_id)

    def discard(self, flow_id: str) -> None:
        """``flow_id`` runs, ended or hibernated: it is not idle."""
        self._since.pop(flow_id, None)

    def take_idle_since(self, cutoff: float | None) -> list[str]:
        """Take off the flows suspended at or before ``cutoff`` (None: every flow)."""
        taken = []
        while self._since:
            flow_id, since = next(iter(self._since.items()))
            if cutoff is not None and since > cutoff:
                break
            self._since.popitem(last=False)
            taken.append(flow_id)
        return taken


class MemoryBudget:
    """Reads the resident memory against the policy's budget, at most once a second."""

    def __init__(self, policy: HibernationPolicy, now: Callable[[], float]) -> None:
        self._policy = policy
        self._now = now
        self._next_check = float("-inf")
        self._over = False

    def over(self) -> bool:
        """True if the last reading was above the budget (read again if it is time)."""
        budget, read = self._policy.memory_budget_bytes, self._policy.resident_bytes
        if budget is None or read is None:
            return False
        now = self._now()
        if now >= self._next_check:
            self._next_check = now + MEMORY_CHECK_SECONDS
            self._over = read() > budget
        return self._over
