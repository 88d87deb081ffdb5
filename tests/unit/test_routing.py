"""Table tests of the pure inbound routing decision (:func:`statemachine.routing.route`).

Each row is one decision the routing module's docstring lists: a responder started, a session
rejected (no responder, or draining), a message delivered, held, parked (for its session, or
for a kept flow), dropped late, or dead-lettered for each rule it breaks. The ids and reasons
expected are built here from the id grammar (SHA-256 tags, UUID-5 responder flow ids,
``N-<session>-<sequence>`` message ids), never with the helpers ``route`` itself calls; and
every row also checks that routing changed nothing: the flow table, its runtimes and their
states are what they were before.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Callable

import attrs
import pytest

from statemachine.flow_error import ErrorKind, FlowError
from statemachine.flow_table import FlowRuntime, FlowTable
from statemachine.ports import InboundMessage, Responder
from statemachine.routing import (
    MAX_REORDER_WINDOW,
    DeadLetter,
    Deliver,
    DropLate,
    Hold,
    Park,
    Reject,
    Route,
    RoutingContext,
    Start,
    route,
)
from statemachine.session_messages import (
    ConfirmSession,
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionData,
    SessionEnd,
    SessionMessage,
)
from statemachine.state import (
    Checkpoint,
    FlowState,
    FlowStatus,
    InitiatedBy,
    SessionState,
    StartedLocally,
)

US = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"
CAROL = "O=Carol,L=Paris,C=FR"
T0 = 1000.0


def tag(name: str) -> str:
    """A node's identity tag, computed here: the first 16 hex digits of its name's SHA-256."""
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def responder_id(sender: str, initiator_session: str) -> str:
    """The responder flow id, computed here: UUID-5 of ``<sender>|<session>`` in hex."""
    namespace = uuid.UUID("6f1d3c1e-8a43-4e0f-9a57-1f6b2a7d0c11")
    return uuid.uuid5(namespace, f"{sender}|{initiator_session}").hex


# Bob's flow b7 opens a session with us: Bob calls it BOBS, our responder's side is BOBS.r.
BOBS = f"{tag(BOB)}-b7.s0"
BOBS_R = f"{BOBS}.r"
RESPONDER_FLOW = responder_id(BOB, BOBS)
# Our flow f1 opens a session with Bob: we call it OURS, Bob's responder's side is OURS.r.
OURS = f"{tag(US)}-f1.s0"
OURS_R = f"{OURS}.r"
# A session Bob opened whose initial message has not reached a flow here.
UNOPENED = f"{tag(BOB)}-b8.s0"
UNOPENED_R = f"{UNOPENED}.r"

PING = InitialSessionMessage(BOBS, "app.PingFlow", 1, "app", b"ping")
PONG_RESPONDER = Responder("app.PongFlow", 2, "app")
KEPT = FlowError(ErrorKind.INTERNAL, "persistence.store.CheckpointIntegrityError", "bad MAC")


@attrs.frozen
class Registry:
    """Responders by initiating flow class (the ResponderRegistry port)."""

    responders: dict[str, Responder]

    def responder_for(self, initiator_class: str) -> Responder | None:
        return self.responders.get(initiator_class)


CONTEXT = RoutingContext(US, Registry({"app.PingFlow": PONG_RESPONDER}))
DRAINING = attrs.evolve(CONTEXT, draining=True)


def inbound(message_id: str, sender: str = BOB) -> InboundMessage:
    return InboundMessage(message_id, sender, b"<encoded>")


# --- flows the table may hold --------------------------------------------------------------


def our_session(next_receive: int = 0) -> SessionState:
    """Our end of the session f1 opened with Bob (confirmed)."""
    return SessionState(
        OURS,
        OURS_R,
        BOB,
        initiated_by_us=True,
        initiating_flow="app.PingFlow",
        flow_version=1,
        app_name="app",
        initial_sent=True,
        confirmed=True,
        next_send_sequence=1,
        next_receive_sequence=next_receive,
    )


def responder_session() -> SessionState:
    """Our responder's end of the session Bob's b7 opened (the initial message taken in)."""
    return SessionState(
        BOBS_R,
        BOBS,
        BOB,
        initiated_by_us=False,
        initiating_flow="app.PingFlow",
        flow_version=2,
        app_name="app",
        initial_sent=True,
        confirmed=True,
        next_send_sequence=1,
        next_receive_sequence=1,
    )


def initiator(
    *sessions: SessionState, status: FlowStatus = FlowStatus.SUSPENDED, holding: bool = False
) -> FlowRuntime:
    origin = StartedLocally("app.PingFlow", b"\x92\x90\x80")
    checkpoint = Checkpoint("f1", origin, status, T0, sessions=sessions, version=2)
    if status is FlowStatus.HOSPITALIZED:
        checkpoint = attrs.evolve(checkpoint, error=KEPT)
    return FlowRuntime(FlowState(checkpoint), holding=holding)


def responder(
    *sessions: SessionState, status: FlowStatus = FlowStatus.SUSPENDED, holding: bool = False
) -> FlowRuntime:
    origin = InitiatedBy("app.PongFlow", BOBS_R, BOB, 1, "app")
    checkpoint = Checkpoint(RESPONDER_FLOW, origin, status, T0, sessions=sessions, version=1)
    if status is FlowStatus.HOSPITALIZED:
        checkpoint = attrs.evolve(checkpoint, error=KEPT)
    return FlowRuntime(FlowState(checkpoint), holding=holding)


def table(*runtimes: FlowRuntime) -> Callable[[], FlowTable]:
    """A builder of a table holding these runtimes (fresh ones each time it is called)."""

    def build() -> FlowTable:
        flows = FlowTable()
        for runtime in runtimes:
            flows.add(copy.deepcopy(runtime))
        return flows

    return build


EMPTY = table()


# --- the table of decisions ----------------------------------------------------------------


@attrs.frozen
class Case:
    flows: Callable[[], FlowTable]
    message: InboundMessage
    decoded: SessionMessage
    expected: Route
    context: RoutingContext = CONTEXT
    consumed: frozenset[str] = frozenset()


def existing(
    session_id: str, sequence: int, message_id: str, sender: str = BOB
) -> tuple[InboundMessage, ExistingSessionMessage]:
    return inbound(message_id, sender), ExistingSessionMessage(
        session_id, sequence, SessionData(b"data")
    )


def case(
    flows: Callable[[], FlowTable],
    message: tuple[InboundMessage, SessionMessage],
    expected: Route,
    *,
    context: RoutingContext = CONTEXT,
    consumed: frozenset[str] = frozenset(),
) -> Case:
    return Case(flows, message[0], message[1], expected, context, consumed)


INITIAL = (inbound(f"N-{BOBS}-0"), PING)
UNKNOWN_CLASS = attrs.evolve(PING, initiator_flow_class="app.flows.AuditFlow")
CAROLS = f"{tag(CAROL)}-c1.s0"  # a session id under Carol's tag, which Bob sends
UNTAGGED = "b7.s0"  # a session id under no tag at all
TO_OURS = existing(OURS, 0, f"N-{OURS_R}-0")
TO_RESPONDER = existing(BOBS_R, 1, f"N-{BOBS}-1")
CONFIRM = (inbound(f"N-{OURS_R}-0"), ExistingSessionMessage(OURS, 0, ConfirmSession(2, "app")))

CASES = {
    # --- an initial message: a session opens ---
    "start a responder for a valid initial message": case(
        EMPTY, INITIAL, Start(RESPONDER_FLOW, PONG_RESPONDER, PING)
    ),
    "start: another flow of ours is not in the way": case(
        table(initiator(our_session())), INITIAL, Start(RESPONDER_FLOW, PONG_RESPONDER, PING)
    ),
    "reject: no responder registered for the initiating class": case(
        EMPTY,
        (inbound(f"N-{BOBS}-0"), UNKNOWN_CLASS),
        Reject(
            f"{US} has no flow registered to respond to app.flows.AuditFlow (install the "
            "CorDapp whose flow is annotated @initiated_by(AuditFlow))",
            UNKNOWN_CLASS,
        ),
    ),
    "reject: the node is draining": case(
        EMPTY,
        INITIAL,
        Reject(f"{US} is draining: it starts no new flows", PING),
        context=DRAINING,
    ),
    "dead letter: initial message with another sequence's id": case(
        EMPTY,
        (inbound(f"N-{BOBS}-1"), PING),
        DeadLetter(f"initial session message must have id N-{BOBS}-0"),
    ),
    "dead letter: initial message with another session's id": case(
        EMPTY,
        (inbound(f"N-{UNOPENED}-0"), PING),
        DeadLetter(f"initial session message must have id N-{BOBS}-0"),
    ),
    "dead letter: initial message whose session id carries another node's tag": case(
        EMPTY,
        (inbound(f"N-{CAROLS}-0"), attrs.evolve(PING, initiator_session_id=CAROLS)),
        DeadLetter(
            f"session id '{CAROLS}' is not {BOB}'s: a session opened by it starts with its "
            f"tag {tag(BOB)}-"
        ),
    ),
    "dead letter: initial message whose session id carries no tag": case(
        EMPTY,
        (inbound(f"N-{UNTAGGED}-0"), attrs.evolve(PING, initiator_session_id=UNTAGGED)),
        DeadLetter(
            f"session id '{UNTAGGED}' is not {BOB}'s: a session opened by it starts with its "
            f"tag {tag(BOB)}-"
        ),
    ),
    "dead letter: initial message for a session already open": case(
        table(responder(responder_session())),
        INITIAL,
        DeadLetter(f"session {BOBS} already open"),
    ),
    "hold: initial message for a responder waiting for its retry": case(
        table(responder(holding=True)), INITIAL, Hold(RESPONDER_FLOW)
    ),
    # --- a message on an existing session ---
    "deliver to the initiator owning the session": case(
        table(initiator(our_session())), CONFIRM, Deliver("f1", CONFIRM[1])
    ),
    "deliver to the responder owning the session": case(
        table(initiator(our_session()), responder(responder_session())),
        TO_RESPONDER,
        Deliver(RESPONDER_FLOW, TO_RESPONDER[1]),
    ),
    "hold: the owner waits for its retry": case(
        table(initiator(our_session(), holding=True)), TO_OURS, Hold("f1")
    ),
    "dead letter: the session belongs to another counterparty": case(
        table(initiator(our_session())),
        existing(OURS, 0, f"N-{OURS_R}-0", sender=CAROL),
        DeadLetter(f"session {OURS} does not belong to sender {CAROL}"),
    ),
    "dead letter: message id of another sequence": case(
        table(initiator(our_session())),
        existing(OURS, 0, f"N-{OURS_R}-5"),
        DeadLetter(
            f"message id N-{OURS_R}-5 does not match its session and sequence "
            f"(expected N-{OURS_R}-0)"
        ),
    ),
    "dead letter: message id of another session": case(
        table(initiator(our_session())),
        existing(OURS, 0, f"N-{BOBS}-0"),
        DeadLetter(
            f"message id N-{BOBS}-0 does not match its session and sequence (expected N-{OURS_R}-0)"
        ),
    ),
    "dead letter: message id of the session's own side": case(
        table(initiator(our_session())),
        existing(OURS, 0, f"N-{OURS}-0"),
        DeadLetter(
            f"message id N-{OURS}-0 does not match its session and sequence (expected N-{OURS_R}-0)"
        ),
    ),
    "deliver: the last sequence inside the reorder window": case(
        table(initiator(our_session(next_receive=3))),
        existing(OURS, 3 + 1023, f"N-{OURS_R}-1026"),
        Deliver("f1", ExistingSessionMessage(OURS, 1026, SessionData(b"data"))),
    ),
    "deliver: a sequence already received (the transition drops it)": case(
        table(initiator(our_session(next_receive=3))),
        existing(OURS, 1, f"N-{OURS_R}-1"),
        Deliver("f1", ExistingSessionMessage(OURS, 1, SessionData(b"data"))),
    ),
    "dead letter: the first sequence past the reorder window": case(
        table(initiator(our_session(next_receive=3))),
        existing(OURS, 3 + 1024, f"N-{OURS_R}-1027"),
        DeadLetter(
            f"sequence number 1027 is too far ahead of session {OURS} (expecting 3, window 1024)"
        ),
    ),
    "dead letter: past the window even when the owner is holding": case(
        table(initiator(our_session(next_receive=3), holding=True)),
        existing(OURS, 5000, f"N-{OURS_R}-5000"),
        DeadLetter(
            f"sequence number 5000 is too far ahead of session {OURS} (expecting 3, window 1024)"
        ),
    ),
    # --- a message for a session no flow owns ---
    "park: responder session whose initial message is not consumed yet": case(
        EMPTY, existing(UNOPENED_R, 1, f"N-{UNOPENED}-1"), Park(UNOPENED_R)
    ),
    "drop late: responder session whose initial message was consumed": case(
        EMPTY,
        existing(UNOPENED_R, 1, f"N-{UNOPENED}-1"),
        DropLate(UNOPENED_R),
        consumed=frozenset({f"N-{UNOPENED}-0"}),
    ),
    "drop late: a session of ours no flow owns any more": case(EMPTY, TO_OURS, DropLate(OURS)),
    "park for a kept responder whose checkpoint lacks the session": case(
        table(responder(status=FlowStatus.HOSPITALIZED)),
        TO_RESPONDER,
        Park(BOBS_R, kept_flow=RESPONDER_FLOW),
        consumed=frozenset({f"N-{BOBS}-0"}),
    ),
    "park for a kept initiator whose checkpoint lacks the session": case(
        table(initiator(status=FlowStatus.HOSPITALIZED)),
        TO_OURS,
        Park(OURS, kept_flow="f1"),
    ),
    "no kept flow: the flow lacking the session is not hospitalized": case(
        table(initiator(status=FlowStatus.SUSPENDED)), TO_OURS, DropLate(OURS)
    ),
    "no kept flow: the responder id derives from another sender": case(
        table(responder(status=FlowStatus.HOSPITALIZED)),
        existing(BOBS_R, 1, f"N-{BOBS}-1", sender=CAROL),
        Park(BOBS_R),
    ),
}


@pytest.mark.parametrize("row", CASES.values(), ids=CASES.keys())
def test_route_decides_and_changes_nothing(row: Case) -> None:
    flows = row.flows()
    before = copy.deepcopy(vars(flows))
    states = {runtime.flow_id: runtime.state for runtime in flows}
    message, decoded = copy.deepcopy(row.message), copy.deepcopy(row.decoded)

    assert route(row.message, row.decoded, flows, row.context, row.consumed) == row.expected

    assert vars(flows) == before  # runtimes, ready queue, pauses, session owners: all as before
    assert {runtime.flow_id: runtime.state for runtime in flows} == states
    assert all(runtime.state is states[runtime.flow_id] for runtime in flows)
    assert (row.message, row.decoded) == (message, decoded)


def test_the_tables_hold_what_the_cases_assume() -> None:
    """The rows' flows own the sessions they are meant to (and the window is 1024)."""
    assert MAX_REORDER_WINDOW == 1024
    flows = table(initiator(our_session()), responder(responder_session()))()
    assert (flows.owner_of(OURS), flows.owner_of(BOBS_R)) == ("f1", RESPONDER_FLOW)
    kept = table(initiator(status=FlowStatus.HOSPITALIZED))()
    assert kept.owner_of(OURS) is None
    assert [runtime.state.status for runtime in kept] == [FlowStatus.HOSPITALIZED]


def test_a_held_initial_message_for_a_holding_responder_is_held_again() -> None:
    """Routing a redelivered initial message twice gives the same Hold: it is pure."""
    flows = table(responder(holding=True))()
    message, initial = INITIAL
    first = route(message, initial, flows, CONTEXT, frozenset())
    second = route(message, initial, flows, CONTEXT, frozenset())
    assert first == second == Hold(RESPONDER_FLOW)


def test_an_end_on_an_owned_session_is_delivered_like_data() -> None:
    flows = table(initiator(our_session(next_receive=1)))()
    end = ExistingSessionMessage(OURS, 1, SessionEnd())
    assert route(inbound(f"N-{OURS_R}-1"), end, flows, CONTEXT, frozenset()) == Deliver("f1", end)
