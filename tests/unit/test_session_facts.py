"""The session facts a flow's rows keep (``session_facts``): written with the row, true to it.

Every checkpoint row, and the result or exception row of a finished flow, keeps per session
of its flow how many messages it sent and took in and whether the peer confirmed
(:mod:`statemachine.session_facts`). The analytics rely on two promises, held here on real
flows: a flow's ``received`` is exactly the dedup ids its node recorded on the session, and
its ``sent`` is at least every message of it the peer recorded (the peer's records are
numbered below it). Also: a live flow's row says what its checkpoint holds, a refused flow
request keeps ``[]``, and the text is the JSON the analytics parse, whatever a session id
holds.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from flows.testing import MockNetwork, MockNode
from persistence import schema
from persistence.analytics.flow_facts import python_facts
from persistence.sql_transaction import session_facts_text
from samples.pingpong import PingFlow
from statemachine.session_facts import SessionFacts, session_facts
from tests.cordapp import EchoFlow, FailingInitiator

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


def facts(node: MockNode, table: Any, flow_id: str) -> list[dict[str, Any]]:
    """The session facts of ``flow_id``'s row in ``table`` on ``node``."""
    with node.node.database.engine.connect() as connection:
        text = connection.execute(
            select(table.c.session_facts).where(table.c.flow_id == flow_id)
        ).scalar_one()
    parsed: list[dict[str, Any]] = json.loads(text)
    return parsed


def recorded(node: MockNode, session: str) -> list[int]:
    """The sequence numbers ``node`` recorded (dedup ids) on its end ``session``."""
    table = schema.node_message_ids
    with node.node.database.engine.connect() as connection:
        return sorted(
            connection.execute(select(table.c.sequence).where(table.c.session_id == session))
            .scalars()
            .all()
        )


def flow_ids(node: MockNode, table: Any) -> list[str]:
    with node.node.database.engine.connect() as connection:
        return list(connection.execute(select(table.c.flow_id)).scalars().all())


def assert_facts_hold(initiator: MockNode, responder: MockNode, mine: dict[str, Any]) -> None:
    """``mine`` (the initiator's facts of a session) and the responder's agree with the
    dedup ids both nodes recorded."""
    session = mine["session"]
    assert recorded(initiator, session) == list(range(mine["received"]))
    peer = recorded(responder, f"{session}.r")
    assert peer == list(range(len(peer))) and len(peer) <= mine["sent"]


def test_a_finished_ping_pong_keeps_the_facts_of_both_ends(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(PingFlow(bob.party))
    net.run_network()
    assert handle.result() == "Pong"
    (ping,) = facts(alice, schema.node_flow_results, handle.flow_id)
    (pong_flow,) = flow_ids(bob, schema.node_flow_results)
    (pong,) = facts(bob, schema.node_flow_results, pong_flow)
    session = ping["session"]
    # Alice sent the ping (with the session's opening); Bob confirmed, answered and ended
    assert ping == {"session": session, "sent": 1, "received": 3, "confirmed": True}
    assert pong == {"session": f"{session}.r", "sent": 3, "received": 1, "confirmed": True}
    assert_facts_hold(alice, bob, ping)
    assert recorded(bob, f"{session}.r") == list(range(pong["received"]))
    assert len(recorded(alice, session)) <= pong["sent"]


def test_a_live_checkpoint_row_keeps_what_its_checkpoint_holds(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(EchoFlow(bob.party, ["one", "two"]))
    alice.run_once()  # Alice opens the session, sends "one" and waits: nothing delivered yet
    (waiting,) = facts(alice, schema.node_checkpoints, handle.flow_id)
    assert waiting == {
        "session": waiting["session"],
        "sent": 1,
        "received": 0,
        "confirmed": False,
    }
    net.run_network()
    (done,) = facts(alice, schema.node_flow_results, handle.flow_id)
    assert done["session"] == waiting["session"] and done["confirmed"]
    assert done["sent"] == 4  # "one", "two", "" and the end
    assert_facts_hold(alice, bob, done)
    (responder,) = flow_ids(bob, schema.node_flow_results)
    (echoed,) = facts(bob, schema.node_flow_results, responder)
    assert recorded(bob, f"{waiting['session']}.r") == list(range(echoed["received"]))


def test_a_failed_flow_keeps_its_facts_with_its_error(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(FailingInitiator(bob.party, "flow_exception"))
    net.run_network()
    assert handle.done()
    (failed,) = facts(alice, schema.node_flow_exceptions, handle.flow_id)
    assert failed["confirmed"] and failed["received"] == 2  # the confirmation and the error
    assert_facts_hold(alice, bob, failed)
    (responder,) = flow_ids(bob, schema.node_flow_exceptions)
    (theirs,) = facts(bob, schema.node_flow_exceptions, responder)
    assert theirs["session"] == f"{failed['session']}.r" and theirs["sent"] == 2


def test_the_facts_of_a_state_are_its_sessions_counts() -> None:
    from statemachine.state import SessionState

    session = SessionState(
        session_id="T-F.s0",
        peer_session_id="T-F.s0.r",
        counterparty=BOB,
        initiated_by_us=True,
        initiating_flow="app.F",
        flow_version=1,
        app_name="app",
        confirmed=True,
        next_send_sequence=4,
        next_receive_sequence=2,
    )
    assert session_facts([session]) == (SessionFacts("T-F.s0", 4, 2, True),)
    assert session_facts_text(()) == "[]"


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=130),
            st.integers(0, 10**12),
            st.integers(0, 10**12),
            st.booleans(),
        ),
        max_size=5,
    )
)
def test_the_text_written_is_the_json_the_analytics_read(
    sessions: list[tuple[str, int, int, bool]],
) -> None:
    """Whatever a session id holds (quotes, backslashes, line breaks, non-ASCII)."""
    written = session_facts_text([SessionFacts(*session) for session in sessions])
    expected = [
        {"session": s, "sent": sent, "received": received, "confirmed": confirmed}
        for s, sent, received, confirmed in sessions
    ]
    assert json.loads(written) == expected
    assert python_facts(written) == expected
