"""initiate_flow to a party the network map does not know fails the flow at once."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from flows import Party, UnknownPartyError
from flows.testing import MockNetwork
from tests.cordapp import BEHAVIOUR, AskStrangerFlow

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"
NOBODY = Party("O=Nobody,L=Nowhere,C=XX")


def test_an_unknown_party_fails_the_flow_at_once(net: MockNetwork) -> None:
    alice, _ = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(AskStrangerFlow(NOBODY))
    net.run_network()
    with pytest.raises(
        UnknownPartyError, match="cannot reach O=Nobody,L=Nowhere,C=XX: it is not on"
    ):
        handle.result()
    # Nothing was queued for the stranger: no outbox row, no message on the network.
    assert alice.node.database.count("node_outbox") == 0
    assert alice.node.database.count("node_checkpoints") == 0


def test_a_flow_may_catch_it_and_replay_gives_the_same_answer(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(AskStrangerFlow(NOBODY, fallback=bob.party))
    # Crash once the flow has checkpointed its wait for the answer (the refusal is in its
    # journal): the node restarts and replays the journal, refusal included.
    alice.crash_at("after_commit", nth=alice.boundary_counts["after_commit"] + 1)
    net.run_network()
    assert alice.crashes == 1
    assert alice.flow_handle(handle.flow_id).result() == "hello"
    assert alice.node.database.count("node_flow_exceptions") == 0


def test_a_known_party_is_not_refused(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(AskStrangerFlow(bob.party))
    net.run_network()
    assert handle.result() == "hello"


def _run_until(net: MockNetwork, done: Callable[[], bool]) -> None:
    for _ in range(20):
        net.run_network(advance_clock=False)
        if done():
            return
    raise AssertionError("the condition did not come true")


def test_a_party_that_left_keeps_a_live_flows_rows_and_a_killed_ones_are_dropped(
    net: MockNetwork, caplog: pytest.LogCaptureFixture
) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    BEHAVIOUR["after_initiate"] = lambda: net.peer_keys.remove(BOB)  # Bob leaves the map
    handle = alice.start_flow(AskStrangerFlow(bob.party))
    # run_network returns: a row for a party off the map is not work a round can do (the
    # clock stays, so that the flow's receive does not time out)
    net.run_network(advance_clock=False)
    outbox = alice.node.database.outbox
    (row,) = outbox.pending_outbox()
    assert row.target == BOB
    assert alice.node.abandoned_reason(row) is None  # the flow is live: kept, tried again
    net.run_network(advance_clock=False)
    assert outbox.contains(row.message_id)

    with caplog.at_level(logging.WARNING, logger="fiberflow.outbox"):
        alice.kill_flow(handle.flow_id, "Bob left")
        _run_until(net, lambda: not outbox.pending_outbox())
    assert alice.node.relay.waiting() == 0
    dropped = [r.getMessage() for r in caplog.records if "no longer sent" in r.getMessage()]
    assert any(row.message_id in line for line in dropped)
    assert all("has ended" in line for line in dropped)


def test_an_operator_drop_stops_the_retries(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    BEHAVIOUR["after_initiate"] = lambda: net.peer_keys.remove(BOB)
    alice.start_flow(AskStrangerFlow(bob.party))
    net.run_network(advance_clock=False)
    outbox = alice.node.database.outbox
    (row,) = outbox.pending_outbox()
    outbox.delete_outbox([row.message_id])  # what `fiberflow outbox drop` does
    assert alice.node.abandoned_reason(row) == "dropped by an operator"
    _run_until(net, lambda: alice.node.relay.waiting() == 0)
