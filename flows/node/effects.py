"""Side effects that flows write to the node's own database, exactly once.

``FlowLogic.in_transaction(effect)`` asks for ``effect(connection)`` to run inside the
database transaction that commits the current step of the flow: the same transaction as the
checkpoint, the dedup ids and the outbox rows of that step. The request is journaled, so:

* if the node dies before that commit, nothing of the step happened: when the step is
  redone after the restart, the effect is asked for, and run, again: once in all;
* once the commit happened, a replay finds the request in the journal and never runs the
  effect again.

The callables stay in memory with the node (:class:`FlowEffectRegistry`), keyed by flow id
and the ordinal of the request within the flow's run, which is the same on every replay
because flow code is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flows.errors import FiberflowError
from flows.node.busy import BusyMonitor
from statemachine.actions import RunFlowEffects
from statemachine.ports import StoreTransaction

FlowEffect = Callable[[Any], None]
"""A side effect: called with the transaction's SQLAlchemy ``Connection``."""


class FlowEffectError(FiberflowError):
    """A flow's side effect could not run; the step's transaction was rolled back."""

    def __init__(self, message: str, flow_id: str | None = None) -> None:
        super().__init__(message)
        self.flow_id = flow_id
        """The flow whose effect failed (the flow hospital counts against it)."""


class FlowEffectRegistry:
    """The effects flows asked for and not yet run (implements ``ports.FlowEffects``)."""

    def __init__(self, monitor: BusyMonitor | None = None) -> None:
        self._effects: dict[tuple[str, int], tuple[str, FlowEffect, str]] = {}
        self._ended: set[str] = set()
        self._monitor = monitor or BusyMonitor()

    def register(
        self, flow_id: str, ordinal: int, label: str, effect: FlowEffect, flow_class: str = ""
    ) -> None:
        """Keep ``effect`` until the transaction of its step runs it."""
        self._effects[(flow_id, ordinal)] = (label, effect, flow_class)

    def run(self, actions: Sequence[RunFlowEffects], transaction: StoreTransaction) -> None:
        """Run the effects of ``actions`` in order, with the transaction's handle.

        They are kept until :meth:`committed`: if the transaction fails, the same step may be
        committed again (alone, or after a retry) and its effects must run again.
        """
        handle = transaction.handle
        for action in actions:
            for ordinal in action.ordinals:
                found = self._effects.get((action.flow_id, ordinal))
                if found is None:
                    raise FlowEffectError(
                        f"flow {action.flow_id}: side effect #{ordinal} was asked for but is "
                        "not known to this node (was the flow's code changed?)",
                        action.flow_id,
                    )
                label, effect, flow_class = found
                if handle is None:
                    raise FlowEffectError(
                        f"flow {action.flow_id}: in_transaction({label!r}) needs a database; "
                        "this node runs with checkpoints off",
                        action.flow_id,
                    )
                try:
                    with self._monitor.running(action.flow_id, flow_class):
                        effect(handle)
                except Exception as error:
                    raise FlowEffectError(
                        f"flow {action.flow_id}: side effect {label!r} raised "
                        f"{type(error).__name__}: {error}",
                        action.flow_id,
                    ) from error

    def committed(self, actions: Sequence[RunFlowEffects]) -> None:
        """The transaction that ran ``actions``' effects committed: they are done."""
        for action in actions:
            for ordinal in action.ordinals:
                self._effects.pop((action.flow_id, ordinal), None)
        self._purge_ended()

    def forget(self, flow_id: str) -> None:
        """The flow ended: drop what is left of it once its last transaction has run.

        (A flow ends before the round's transaction runs its last effects, so the entries
        left over, effects registered again during a replay, are dropped once the next
        transaction that ran effects has committed.)
        """
        self._ended.add(flow_id)

    def _purge_ended(self) -> None:
        if self._ended:
            ended, self._ended = self._ended, set()
            for key in [k for k in self._effects if k[0] in ended]:
                del self._effects[key]

    def __len__(self) -> int:
        return len(self._effects)
