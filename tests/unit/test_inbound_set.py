"""A node consuming its current inbound and a former one as one transport (InboundSet).

Two in-memory networks stand for Bob's old and new inbounds: messages from both reach his
handler, each acknowledgement settles the delivery on the inbound that made it (and only
there), and what Bob sends goes through his current inbound.
"""

from __future__ import annotations

import pytest

from messaging.inbound_set import InboundSet
from messaging.inmemory import InMemoryNetwork
from messaging.service import Message

BOB = "O=Bob,L=New York,C=US"
ALICE = "O=Alice,L=London,C=GB"
TOPIC = "platform.session"


def message(message_id: str) -> Message:
    return Message(message_id, TOPIC, ALICE, b"hello")


def test_messages_from_both_inbounds_reach_the_node_and_are_settled_where_they_came_from() -> None:
    old, new = InMemoryNetwork(seed=1), InMemoryNetwork(seed=2)
    bob = InboundSet(new.endpoint(BOB), [old.endpoint(BOB)])
    received: list[Message] = []
    bob.add_handler(TOPIC, received.append)
    bob.start()
    old.endpoint(ALICE).send(message("sent-before-the-move"), BOB)
    new.endpoint(ALICE).send(message("sent-after-the-move"), BOB)
    assert old.deliver(BOB) == 1 and new.deliver(BOB) == 1
    assert sorted(m.message_id for m in received) == ["sent-after-the-move", "sent-before-the-move"]
    assert (old.in_flight(BOB), new.in_flight(BOB)) == (1, 1)
    from_old = next(m for m in received if m.message_id == "sent-before-the-move")
    bob.acknowledge(from_old)
    assert (old.in_flight(BOB), new.in_flight(BOB)) == (0, 1)
    bob.acknowledge(next(m for m in received if m is not from_old))
    assert (old.in_flight(BOB), new.in_flight(BOB)) == (0, 0)


def test_unacknowledged_deliveries_come_back_on_their_own_inbound_after_a_stop() -> None:
    old, new = InMemoryNetwork(seed=1), InMemoryNetwork(seed=2)
    bob = InboundSet(new.endpoint(BOB), [old.endpoint(BOB)])
    bob.add_handler(TOPIC, lambda m: None)
    bob.start()
    old.endpoint(ALICE).send(message("m1"), BOB)
    old.deliver(BOB)
    bob.stop()
    assert (old.pending(BOB), new.pending(BOB)) == (1, 0)


def test_sends_go_through_the_current_inbound() -> None:
    old, new = InMemoryNetwork(seed=1), InMemoryNetwork(seed=2)
    new.endpoint(ALICE)
    old.endpoint(ALICE)
    bob = InboundSet(new.endpoint(BOB), [old.endpoint(BOB)])
    bob.send(message("reply"), ALICE)
    assert (new.pending(ALICE), old.pending(ALICE)) == (1, 0)


def test_a_delivery_from_elsewhere_is_refused_and_another_nodes_inbound_too() -> None:
    network = InMemoryNetwork()
    bob = InboundSet(network.endpoint(BOB), [])
    with pytest.raises(ValueError, match="not delivered by this inbound set"):
        bob.acknowledge(message("m1"))
    with pytest.raises(ValueError, match="is O=Alice"):
        InboundSet(network.endpoint(BOB), [network.endpoint(ALICE)])


class PartitionRecorder:
    """An in-memory endpoint that also records the partition calls a worker makes."""

    def __init__(self, endpoint: object) -> None:
        self.endpoint = endpoint
        self.partitions: list[frozenset[int] | None] = []
        self.released: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.endpoint, name)

    def consume_partitions(self, partitions: frozenset[int] | None) -> None:
        self.partitions.append(partitions)

    def release(self, delivered: Message) -> None:
        self.released.append(delivered.message_id)


def test_partition_calls_reach_every_inbound_and_a_release_the_one_that_delivered() -> None:
    old, new = InMemoryNetwork(seed=1), InMemoryNetwork(seed=2)
    current, former = PartitionRecorder(new.endpoint(BOB)), PartitionRecorder(old.endpoint(BOB))
    bob = InboundSet(current, [former])  # type: ignore[arg-type]
    received: list[Message] = []
    bob.add_handler(TOPIC, received.append)
    bob.start()
    bob.consume_partitions(frozenset({1, 2}))
    assert current.partitions == former.partitions == [frozenset({1, 2})]
    old.endpoint(ALICE).send(message("from-the-old-inbound"), BOB)
    old.deliver(BOB)
    bob.release(received[0])
    assert (former.released, current.released) == (["from-the-old-inbound"], [])


def test_an_inbound_that_cannot_route_by_partition_is_named() -> None:
    old, new = InMemoryNetwork(seed=1), InMemoryNetwork(seed=2)
    bob = InboundSet(new.endpoint(BOB), [old.endpoint(BOB)])
    with pytest.raises(
        ValueError, match="routes messages by partition.*InMemoryMessaging does not"
    ):
        bob.consume_partitions(frozenset({0}))
