"""Failures pinned on one flow or one inbound message, so the node goes on serving the others.

With a :class:`~statemachine.ports.FailurePolicy` (the node's flow hospital):

* a failed group commit is retried one flow per transaction (:meth:`FailureIsolation.commit`):
  the flows whose transaction fails again are the ones at fault, the others commit;
* a flow at fault stops where it is and holds, raw and unacknowledged, the deliveries it had
  taken in (:meth:`FailureIsolation.flow_failed`); the policy says whether it is resumed
  from its last checkpoint after a backoff of its own (scheduled here), kept in the
  hospital, or failed (both carried out by the scheduler);
* a message whose routing raised is routed again after its own backoff, or quarantined
  (:meth:`FailureIsolation.message_failed`).

Errors the policy calls node-wide propagate.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Callable, Sequence

from statemachine.actions import AcknowledgeMessages, Action, RecordInboundMessages
from statemachine.deliveries import Deliveries
from statemachine.errors import AfterCommitError
from statemachine.events import DeliverSessionMessage, Event, KillFlow
from statemachine.executor import ActionExecutor
from statemachine.flow_error import FlowError
from statemachine.flow_table import FlowRuntime, FlowTable
from statemachine.ports import FailureAction, FailurePolicy, FailureTreatment, InboundMessage
from statemachine.timers import RetryQueue, WakeUps

log = logging.getLogger("fiberflow.statemachine")

MAX_LOGGED_ID = 200
"""Characters of an inbound id or sender shown in a log line (they come from outside)."""

Batch = list[tuple[str, tuple[Action, ...]]]
"""A round's actions, each group with the flow whose transition made it."""


class FailureIsolation:
    """Pins failures on flows and messages (see the module docstring)."""

    def __init__(
        self,
        policy: FailurePolicy,
        flows: FlowTable,
        deliveries: Deliveries,
        wake_ups: WakeUps,
        executor: ActionExecutor,
        now: Callable[[], float],
    ) -> None:
        self._policy = policy
        self._flows = flows
        self._deliveries = deliveries
        self._wake_ups = wake_ups
        self._executor = executor
        self._now = now
        self._flow_retries: RetryQueue[str] = RetryQueue()
        self._message_retries: RetryQueue[InboundMessage] = RetryQueue()
        self._failed_flows: set[str] = set(policy.counted())  # counts outliving a scheduler
        self._failed_messages: set[str] = set()
        self.fail_on_start: dict[str, tuple[str, FlowError]] = {}
        """Responders that failed for good before their first commit: they end as soon as
        their initial message creates them again."""

    def is_node_wide(self, error: Exception) -> bool:
        """The policy's word: True if nobody in particular caused ``error``."""
        return self._policy.is_node_wide(error)

    # --- flows ------------------------------------------------------------------------------

    def commit(self, batch: Batch) -> dict[str, Exception]:
        """Commit the round's actions in one transaction; on failure, find the flows at fault.

        Returns the flows whose own transaction failed, with their errors.
        """
        try:
            self._executor.execute([actions for _, actions in batch])
            return {}
        except AfterCommitError:
            raise
        except Exception as error:
            if self._policy.is_node_wide(error):
                raise
            group_error = error
        by_flow: dict[str, list[tuple[Action, ...]]] = {}
        for flow_id, actions in batch:
            by_flow.setdefault(flow_id, []).append(actions)
        if len(by_flow) == 1:
            return {next(iter(by_flow)): group_error}
        failures: dict[str, Exception] = {}
        for flow_id, groups in by_flow.items():
            try:
                self._executor.execute(groups)
            except AfterCommitError:
                raise
            except Exception as error:
                if self._policy.is_node_wide(error):
                    raise
                failures[flow_id] = error
        return failures

    def forgive_committed(self, batch: Batch) -> None:
        """Flows that failed before and have now committed a step start counting again."""
        if not self._failed_flows:
            return
        for flow_id, _ in batch:
            runtime = self._flows.get(flow_id)
            if flow_id in self._failed_flows and runtime is not None and not runtime.holding:
                self._failed_flows.discard(flow_id)
                self._policy.flow_recovered(flow_id)

    def flow_failed(
        self, runtime: FlowRuntime, error: Exception, actions: Sequence[tuple[Action, ...]]
    ) -> FailureTreatment:
        """Stop the flow, hold what it had taken in, schedule its retry if that is the treatment.

        KEEP and FAIL are for the scheduler to carry out. Raises ``error`` if the policy calls
        it node-wide.
        """
        flow_id = runtime.flow_id
        treatment = self._policy.flow_failed(flow_id, error)
        if treatment.action is FailureAction.RAISE:
            raise error
        if treatment.action not in (FailureAction.RETRY, FailureAction.KEEP, FailureAction.FAIL):
            raise ValueError(f"{treatment.action} is not a treatment for a flow")
        self._failed_flows.add(flow_id)
        log.warning(
            "flow %s: %s (rule %s): %s",
            flow_id,
            treatment.action.value,
            treatment.rule,
            treatment.reason,
            exc_info=treatment.rule == "unexplained",
        )
        self._hold(runtime, actions)
        if treatment.action is FailureAction.RETRY:
            runtime.retry_at = self._now() + treatment.delay
            self._flow_retries.push(runtime.retry_at, flow_id)
        return treatment

    def _hold(self, runtime: FlowRuntime, actions: Sequence[tuple[Action, ...]]) -> None:
        """Stop a failed flow where it is; hold the deliveries it had taken in, raw."""
        if runtime.fiber is not None:
            runtime.fiber.abort()
            runtime.fiber = None
        runtime.continuation = None
        runtime.holding = True
        taken: list[str] = [r.message_id for r in runtime.state.unrecorded_inbound]
        for group in actions:
            for action in group:
                if isinstance(action, RecordInboundMessages):
                    taken.extend(r.message_id for r in action.records)
                elif isinstance(action, AcknowledgeMessages):
                    taken.extend(action.message_ids)
        kept_events: deque[Event] = deque()
        for event in runtime.events:
            if isinstance(event, DeliverSessionMessage):
                taken.append(event.message_id)
            elif isinstance(event, KillFlow):
                kept_events.append(event)
        runtime.events = kept_events
        for delivery in self._deliveries.release(taken):
            runtime.hold(delivery)
        self._wake_ups.forget(runtime.flow_id)
        self._flows.unready(runtime.flow_id)

    def flows_due(self) -> list[str]:
        """Flows whose retry is due now (each still waiting for exactly that retry)."""
        due = []
        for at, flow_id in self._flow_retries.pop_due(self._now()):
            runtime = self._flows.get(flow_id)
            if runtime is not None and runtime.retry_at == at:
                due.append(flow_id)
        return due

    # --- messages ---------------------------------------------------------------------------

    def message_failed(self, message: InboundMessage, error: Exception) -> FailureTreatment:
        """Route ``message`` again later, or let the scheduler quarantine it.

        Raises ``error`` if the policy calls it node-wide.
        """
        self._deliveries.undo_take_in(message)
        key = message_key(message)
        treatment = self._policy.message_failed(key, error)
        if treatment.action is FailureAction.RAISE:
            raise error
        if treatment.action not in (FailureAction.RETRY, FailureAction.QUARANTINE):
            raise ValueError(f"{treatment.action} is not a treatment for a message")
        log.warning(
            "message %s from %s: %s (rule %s): %s",
            message.message_id[:MAX_LOGGED_ID],
            message.sender[:MAX_LOGGED_ID],
            treatment.action.value,
            treatment.rule,
            treatment.reason,
            exc_info=treatment.rule == "unexplained",
        )
        if treatment.action is FailureAction.RETRY:
            self._failed_messages.add(key)
            self._message_retries.push(self._now() + treatment.delay, message)
        else:
            self._failed_messages.discard(key)
        return treatment

    def message_routed(self, message: InboundMessage) -> None:
        """``message`` was routed: if it had failed before, its failures are forgiven."""
        if not self._failed_messages:
            return
        key = message_key(message)
        if key in self._failed_messages:
            self._failed_messages.discard(key)
            self._policy.message_recovered(key)

    def messages_due(self) -> list[InboundMessage]:
        """Messages whose retry is due now."""
        return [message for _, message in self._message_retries.pop_due(self._now())]

    def next_due(self) -> float | None:
        """When the earliest retry (of a flow or a message) is due, or None."""
        candidates = (self._flow_retries.next_due(), self._message_retries.next_due())
        due = [d for d in candidates if d is not None]
        return min(due) if due else None


def message_key(message: InboundMessage) -> str:
    """What identifies a message across its deliveries (id, sender and contents)."""
    digest = hashlib.sha256()
    for part in (message.message_id.encode(), message.sender.encode(), message.data):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
