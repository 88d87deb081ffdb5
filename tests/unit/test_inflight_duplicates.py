"""A second copy of a message that is still being taken in is held, not settled at once.

Transports redeliver a message whose first copy is not yet acknowledged (the SQL queue when
a lease expires, RabbitMQ after a reconnect). Settling that copy at once could leave no
durable copy before the first copy's transaction commits; a crash then would lose it. The
copy is settled with the first one, after the commit.
"""

from __future__ import annotations

from flows.testing import MockNetwork
from samples.pingpong import PingFlow
from statemachine.ports import InboundMessage
from statemachine.state import FlowStatus
from tests.helpers import assert_drained

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


def test_a_redelivered_copy_of_a_held_message_is_not_settled_before_the_commit(
    net: MockNetwork,
) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(PingFlow(bob.party))
    while alice.flow_status(handle.flow_id) is not FlowStatus.SUSPENDED:
        net.run_once()
    alice.pause_flow(handle.flow_id)  # Bob's answer will be held, taken in but not committed
    manager = alice.node.manager
    seen: list[InboundMessage] = []
    deliver = manager.deliver

    def recording(message: InboundMessage) -> None:
        seen.append(message)
        deliver(message)

    manager.deliver = recording  # type: ignore[method-assign]
    net.run_network()
    held = len(seen)  # Bob's answer and the end of his side of the session
    assert held >= 1 and {m.sender for m in seen} == {BOB}
    address = alice.node.messaging.my_address
    assert net.messaging.in_flight(address) == held

    for message in seen:  # the transport hands over the same messages again
        deliver(message)
    net.run_network()

    assert manager.statistics.duplicates_dropped == held
    assert net.messaging.in_flight(address) == held, "held copies must stay unacknowledged"
    alice.restart()  # memory lost: the answer must come back from the transport
    alice.resume_flow(handle.flow_id)
    net.run_network()
    assert handle.result() == "Pong"
    assert_drained(net)
