"""Taking in inbound messages: check, decode, route, and carry out the routing decision.

:class:`Intake` holds what the transport delivered until the next round, then, for the whole
batch: decodes the messages, checks in one query which ids were consumed before, asks
:func:`statemachine.routing.route` where each goes, and carries that out: a delivery queued
for its flow, a responder started (by the scheduler), a session rejected, a message held,
parked, dropped or dead-lettered. Messages waiting for their session are in its
:class:`~statemachine.parking.ParkingLot`.

The store is asked only about what no live flow can answer for: initial messages, messages
for sessions no live flow owns (not open yet, or over) and the initial messages of the
responder sessions those name. A message for a session a live flow owns needs no query: the
transaction that recorded a message as consumed also checkpointed its session's advanced
sequence number (or kept it among the session's early messages), and the flow's state is at
least that far, so a consumed copy is refused by the session itself (its sequence number is
behind, or already waiting) and settled as a dropped duplicate, after a lease check. The
primary key of the dedup ids refuses a consumed id in the transaction in any case. A round
that routes only messages for live flows (an initiator's confirms and replies) reads nothing.

With a :class:`~statemachine.isolation.FailureIsolation`, a message whose handling raises is
routed again after its own backoff, and quarantined (dead-lettered) when it keeps failing.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection

import attrs

from statemachine.deliveries import Deliveries
from statemachine.events import DeliverSessionMessage
from statemachine.executor import ActionExecutor
from statemachine.flow_table import FlowTable
from statemachine.isolation import MAX_LOGGED_ID, FailureIsolation
from statemachine.parking import (
    MAX_PARKED,
    MAX_PARKED_PER_SESSION,
    PARKED_TIMEOUT_SECONDS,
    ParkingLot,
)
from statemachine.ports import CheckpointStore, Clock, FailureAction, InboundMessage, MessageCodec
from statemachine.routing import (
    DeadLetter,
    Deliver,
    DropLate,
    Hold,
    Park,
    Reject,
    Route,
    RoutingContext,
    Start,
    Wake,
    initial_message_of,
    route,
)
from statemachine.session_messages import ExistingSessionMessage, SessionMessage
from statemachine.statistics import ManagerStatistics
from statemachine.transition import reject_initial_session

log = logging.getLogger("fiberflow.statemachine")


@attrs.frozen
class _Undecodable:
    reason: str


class Intake:
    """Inbound messages, from the transport's hand-over to their flows (see the docstring)."""

    def __init__(
        self,
        *,
        context: RoutingContext,
        store: CheckpointStore,
        codec: MessageCodec,
        acknowledge: Callable[[InboundMessage], None],
        flows: FlowTable,
        deliveries: Deliveries,
        executor: ActionExecutor,
        clock: Clock,
        statistics: ManagerStatistics,
        start_responder: Callable[[InboundMessage, Start], None],
        isolation: FailureIsolation | None,
        wake: Callable[[str], None],
    ) -> None:
        """``wake`` restores a dormant flow (a message arrived for one of its sessions)."""
        self.context = context
        self._store = store
        self._codec = codec
        self._acknowledge = acknowledge
        self._flows = flows
        self._deliveries = deliveries
        self._executor = executor
        self._clock = clock
        self._statistics = statistics
        self._start_responder = start_responder
        self._isolation = isolation
        self._wake = wake
        self._inbox: deque[InboundMessage] = deque()
        self.parking = ParkingLot(clock.now)

    def deliver(self, message: InboundMessage) -> None:
        """Queue a message (for the next round). Safe from a transport's own thread."""
        self._inbox.append(message)

    def requeue(self, messages: Collection[InboundMessage]) -> None:
        """Route these again in the next round (held, parked or retried messages)."""
        self._inbox.extend(messages)

    def release_parked(self, opened_sessions: list[str]) -> None:
        """These sessions just opened: what was parked for them is routed again."""
        for session_id in opened_sessions:
            self._inbox.extend(self.parking.release(session_id))

    def has_messages(self) -> bool:
        """True if messages wait for the next round."""
        return bool(self._inbox)

    def route_all(self) -> bool:
        """Route every queued message (see the module docstring); True if there were any."""
        if not self._inbox:
            return False
        # popleft, not clear(): a transport thread may append while we drain.
        messages = [self._inbox.popleft() for _ in range(len(self._inbox))]
        decoded: list[SessionMessage | _Undecodable | None] = []
        ids: list[str] = []
        for message in messages:
            decoded.append(None if message.rejection is not None else self._decode_one(message))
            body = decoded[-1]
            if isinstance(body, ExistingSessionMessage):
                if self._flows.owner_of(body.recipient_session_id) is not None:
                    continue  # its live flow's session refuses a consumed copy (see the docstring)
                initial = initial_message_of(body.recipient_session_id)
                if initial is not None:
                    ids.append(initial)
            ids.append(message.message_id)
        consumed = self._store.consumed_among(ids) if ids else set()
        for message, body in zip(messages, decoded, strict=True):
            if self._isolation is None:
                self._route(message, body, consumed)
                continue
            try:
                self._route(message, body, consumed)
            except Exception as error:
                self.failed(message, error)
            else:
                self._isolation.message_routed(message)
        return True

    def _decode_one(self, message: InboundMessage) -> SessionMessage | _Undecodable:
        try:
            return self._codec.decode(message.data)
        except Exception as error:  # any decoding failure: keep the message, tell why
            return _Undecodable(f"undecodable session message: {error}")

    def _route(
        self,
        message: InboundMessage,
        decoded: SessionMessage | _Undecodable | None,
        consumed: Collection[str],
    ) -> None:
        self._statistics.messages_received += 1
        if message.rejection is not None:  # refused even if its id was seen: it is forged
            self.dead_letter(message, message.rejection)
            return
        if message.message_id in consumed:
            self._statistics.duplicates_dropped += 1
            self._deliveries.drop(message, self._executor.transactions)
            return
        if self._deliveries.add_copy(message):
            # Another copy (a redelivery: an expired lease, a reconnect) is being taken in:
            # it is settled with the first, after the commit.
            self._statistics.duplicates_dropped += 1
            return
        assert decoded is not None
        if isinstance(decoded, _Undecodable):
            self.dead_letter(message, decoded.reason)
            return
        decision = route(message, decoded, self._flows, self.context, consumed)
        if isinstance(decision, Wake):
            self._wake(decision.flow_id)  # it is in memory now: routed to it as to any flow
            decision = route(message, decoded, self._flows, self.context, consumed)
            assert not isinstance(decision, Wake), "a woken flow is not dormant"
        self._apply(message, decision)

    def _apply(self, message: InboundMessage, decision: Route) -> None:
        """Carry out what :func:`statemachine.routing.route` decided for ``message``.

        (A :class:`~statemachine.routing.Wake` never gets here: the flow is woken and the
        message routed again.)
        """
        if isinstance(decision, Deliver):
            self._deliveries.take_in(message)
            body = decision.message
            event = DeliverSessionMessage(
                body.recipient_session_id,
                message.message_id,
                message.sender,
                body.sequence,
                body.body,
                self._clock.now(),
            )
            self._flows.queue_event(decision.flow_id, event)
        elif isinstance(decision, Start):
            self._deliveries.take_in(message)
            self._start_responder(message, decision)
        elif isinstance(decision, Hold):
            runtime = self._flows.get(decision.flow_id)
            assert runtime is not None
            runtime.hold(message)
        elif isinstance(decision, Park):
            self._park(message, decision)
        elif isinstance(decision, DropLate):
            log.info(
                "dropping message %s for ended session %s",
                message.message_id,
                decision.session_id,
            )
            self._statistics.late_messages_dropped += 1
            self._deliveries.drop(message, self._executor.transactions)
        elif isinstance(decision, Reject):
            log.warning("rejecting session from %s: %s", message.sender, decision.reason)
            self._deliveries.take_in(message)
            self._statistics.sessions_rejected += 1
            at = self._clock.now()
            actions = reject_initial_session(
                message.message_id, message.sender, decision.initial, decision.reason, at
            )
            self._executor.execute([actions])
        else:
            assert isinstance(decision, DeadLetter), decision
            self.dead_letter(message, decision.reason)

    def _park(self, message: InboundMessage, park: Park) -> None:
        if not self.parking.park(message, park.session_id, expires=park.kept_flow is None):
            self.dead_letter(
                message,
                f"too many messages waiting for session {park.session_id} to open (at most "
                f"{MAX_PARKED_PER_SESSION} per session, {MAX_PARKED} in all)",
            )
        elif park.kept_flow is not None:
            self.parking.hold_for(park.kept_flow, park.session_id)

    def expire_parked(self) -> bool:
        """Dead-letter messages whose session did not open within the timeout."""
        expired = self.parking.expired()
        for session_id, message in expired:
            reason = f"session {session_id} did not open within {PARKED_TIMEOUT_SECONDS:.0f} s"
            if self._isolation is None:
                self.dead_letter(message, reason)
                continue
            try:
                self.dead_letter(message, reason)
            except Exception as error:
                self.failed(message, error)
        return bool(expired)

    def dead_letter(self, message: InboundMessage, reason: str) -> None:
        """Keep ``message`` with ``reason`` (a fenced write) and acknowledge this delivery."""
        log.warning(
            "dead-lettering message %s from %s: %s",
            message.message_id[:MAX_LOGGED_ID],
            message.sender[:MAX_LOGGED_ID],
            reason,
        )
        self._store.dead_letter(message, reason, self._clock.now())
        self._statistics.dead_lettered += 1
        self._acknowledge(message)  # this delivery only: a genuine copy is not touched

    # --- failures pinned on one message ------------------------------------------------------

    def failed(self, message: InboundMessage, error: Exception) -> None:
        """Handling ``message`` raised: route it again later, or quarantine it."""
        assert self._isolation is not None
        treatment = self._isolation.message_failed(message, error)
        self._statistics.failures_pinned += 1
        if treatment.action is FailureAction.QUARANTINE:
            self._quarantine(message, treatment.reason)

    def _quarantine(self, message: InboundMessage, reason: str) -> None:
        """Dead-letter a message that keeps failing, with the reason, and acknowledge it.

        If even that fails (for a reason that is not node-wide), the message is left
        unacknowledged in the transport, out of the node's way, and logged: never lost.
        """
        assert self._isolation is not None
        self._statistics.messages_quarantined += 1
        try:
            self.dead_letter(message, f"quarantined: {reason}")
        except Exception as error:
            if self._isolation.is_node_wide(error):
                raise
            log.error(
                "message %s from %s could not be quarantined (%s: %s); left unacknowledged "
                "in the transport, set aside until the node restarts",
                message.message_id[:MAX_LOGGED_ID],
                message.sender[:MAX_LOGGED_ID],
                type(error).__name__,
                error,
            )
