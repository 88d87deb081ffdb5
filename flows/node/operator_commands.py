"""Operator commands queued in the node database, carried out by the running node.

``fiberflow flow kill|pause|resume|retry`` and ``fiberflow node drain|undrain``
(:mod:`flows.cli.local`, or the HTTP API) write a row to ``node_operator_requests`` and wait
for its outcome (:func:`await_operation`); the node process calls
:meth:`OperatorCommands.process` in its loop, which carries each command out through the
node's own methods and records its outcome for the waiting command to print. A command
that fails for a reason pinned on it is answered with the error; the node goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from flows.party import Party
from persistence.node_store import ControlPlane
from persistence.store import NodeDatabase
from statemachine.partitions import partition_of
from statemachine.ports import Clock, FailurePolicy

log = logging.getLogger("fiberflow.node")

REFUSALS: tuple[type[Exception], ...] = (KeyError,)
"""Errors that answer a command with their message (an unknown flow, for instance)."""


class OperatorCommands:
    """Carries out the queued operator commands (see the module docstring)."""

    def __init__(
        self,
        *,
        party: Party,
        control: ControlPlane,
        clock: Clock,
        hospital: FailurePolicy | None,
        flow_commands: Mapping[str, Callable[[str], None]],
        set_draining: Callable[[bool], int],
        refusals: tuple[type[Exception], ...] = REFUSALS,
    ) -> None:
        """Commands on one flow come from ``flow_commands`` (action -> method).

        ``set_draining`` turns draining on or off and returns the live flows left;
        ``refusals`` are the errors whose message is the answer. Without a ``hospital``
        any other error propagates (what a test wants to see).
        """
        self._party = party
        self._control = control
        self._clock = clock
        self._hospital = hospital
        self._flow_commands = dict(flow_commands)
        self._set_draining = set_draining
        self._refusals = refusals

    def process(self, partitions: Collection[int] | None = None) -> int:
        """Carry out the pending commands; returns how many.

        With ``partitions`` (a worker of a node run by several workers), only the commands
        for flows of those partitions, and the node-wide ones (drain, undrain) if partition 0
        is among them: the others are left for the workers holding theirs.
        """
        pending = self._control.pending_operations()
        if partitions is not None:
            pending = [r for r in pending if _is_for(r.flow_id, partitions)]
        for request in pending:
            outcome = self.operate(request.action, request.flow_id)
            log.info(
                "%s: operator %s %s: %s",
                self._party,
                request.action,
                request.flow_id or "",
                outcome,
            )
            self._control.finish_operation(request.request_id, outcome, self._clock.now())
        return len(pending)

    def operate(self, action: str, flow_id: str | None) -> str:
        """Carry out one command; returns its outcome (``ok: ...`` or ``error: ...``)."""
        try:
            if action == "drain":
                return f"draining; {self._set_draining(True)} flow(s) left"
            if action == "undrain":
                return f"accepting new flows; {self._set_draining(False)} flow(s) live"
            if flow_id is None:
                return f"error: {action} needs a flow id"
            command = self._flow_commands.get(action)
            if command is None:
                return f"error: unknown action {action!r}"
            command(flow_id)
            return f"ok: {action} {flow_id}"
        except self._refusals as error:
            return f"error: {error.args[0] if error.args else error}"
        except Exception as error:  # pinned on this command: the node goes on
            if self._hospital is None or self._hospital.is_node_wide(error):
                raise
            log.exception("%s: operator %s %s failed", self._party, action, flow_id or "")
            return f"error: {type(error).__name__}: {error}"


def _is_for(flow_id: str | None, partitions: Collection[int]) -> bool:
    """True if the worker holding ``partitions`` carries out a command for ``flow_id``."""
    if flow_id is None:
        return 0 in partitions  # node-wide: the holder of partition 0
    return partition_of(flow_id) in partitions


def await_operation(
    database: NodeDatabase,
    action: str,
    flow_id: str | None,
    timeout: float,
    should_stop: Callable[[], bool] = lambda: False,
) -> str | None:
    """Queue an operator command and wait for the node's outcome (None: not within timeout).

    The command stays queued if the node does not carry it out in time: it runs when the
    node next polls. ``should_stop`` ends the wait early (None is returned).
    """
    request_id = database.control.request_operation(action, flow_id, time.time())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not should_stop():
        outcome = database.control.operation_outcome(request_id)
        if outcome is not None:
            return outcome
        time.sleep(0.05)
    return None


def operation_succeeded(outcome: str) -> bool:
    """True if a node's outcome of an operator command says it was done."""
    return outcome.startswith(("ok", "draining", "accepting"))
