"""The dedup read asks the store only about messages no live flow owns.

A message for a session a live flow owns is checked by the session itself: the transaction
that recorded a message as consumed also checkpointed its session's advanced sequence number,
so a consumed copy arriving later is refused by sequence and settled as a dropped duplicate
(statemachine/intake.py). Initial messages and messages for sessions no live flow owns are
still looked up, in one query per round.
"""

from __future__ import annotations

from collections.abc import Sequence

from flows.testing import MockNetwork, MockNode
from tests.cordapp import EchoFlow
from tests.helpers import assert_drained

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


def _spy_reads(node: MockNode) -> list[list[str]]:
    """Record every batch of ids the node's store is asked about."""
    store = node.node.database.checkpoints
    asked: list[list[str]] = []
    original = store.consumed_among

    def consumed_among(message_ids: Sequence[str]) -> set[str]:
        asked.append(list(message_ids))
        return original(message_ids)

    store.consumed_among = consumed_among  # type: ignore[method-assign]
    return asked


def _address(node: MockNode) -> str:
    return node.node.messaging.my_address


def _step(net: MockNetwork, node: MockNode) -> None:
    """Hand ``node`` one ready message and run one round on it."""
    assert net.messaging.deliver_one(_address(node), 0)
    node.node.run_once()


def test_replies_to_a_live_flow_need_no_read_and_a_consumed_copy_is_refused(
    net: MockNetwork,
) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    asked = _spy_reads(alice)
    handle = alice.start_flow(EchoFlow(bob.party, ["one", "two"]))
    alice.node.run_once()  # "one" goes out, with the session's initial message
    while net.messaging.pending(_address(bob)):
        _step(net, bob)  # Bob's confirm and "ONE" come back
    replies = net.messaging.pending(_address(alice))
    assert replies >= 1
    net.messaging.duplicate_one(_address(alice), 0)  # a redelivery, queued behind the rest
    for _ in range(replies):
        _step(net, alice)  # each reply is taken in and committed
    dedup_rows = alice.node.database.count("node_message_ids")
    _step(net, alice)  # the copy of a reply that is consumed already
    assert alice.node.database.count("node_message_ids") == dedup_rows
    assert asked == [], "messages for a live flow's sessions are checked by the session"
    net.run_network()
    assert handle.result() == ["ONE", "TWO"]
    assert_drained(net)  # the refused copy was acknowledged too


def test_initial_messages_are_still_looked_up_and_a_consumed_one_is_dropped(
    net: MockNetwork,
) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    asked = _spy_reads(bob)
    handle = alice.start_flow(EchoFlow(bob.party, ["one"]))
    alice.node.run_once()
    net.messaging.duplicate_one(_address(bob), 0)  # the initial message, twice
    initial = net.messaging.queued(_address(bob))[0].message_id
    net.run_network()
    assert handle.result() == ["ONE"]
    assert any(initial in ids for ids in asked)
    assert bob.node.manager.statistics.duplicates_dropped >= 1
    assert bob.node.manager.statistics.flows_started == 1
    assert_drained(net)
