from __future__ import annotations

from flows.testing import MockNetwork
from samples.pingpong import PingFlow
from tests.helpers import assert_drained, results_by_class

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


def test_ping_pong_completes_and_leaves_nothing_behind(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(PingFlow(bob.party))
    assert alice.checkpoints() == [(handle.flow_id, "samples.pingpong.flows.PingFlow", "UNSTARTED")]

    net.run_network()

    assert handle.result() == "Pong"
    assert results_by_class(alice) == {"PingFlow": 1}
    assert results_by_class(bob) == {"PongFlow": 1}
    assert_drained(net)


def test_many_concurrent_ping_pongs_share_rounds(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(25)]
    handles += [bob.start_flow(PingFlow(alice.party)) for _ in range(25)]

    rounds = net.run_network()

    assert [h.result() for h in handles] == ["Pong"] * 50
    assert results_by_class(alice) == {"PingFlow": 25, "PongFlow": 25}
    # group commit: all flows progress together, so the rounds do not grow with the count
    assert rounds < 10
    assert_drained(net)


def test_result_survives_restart_of_the_initiator(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(PingFlow(bob.party))
    net.run_network()

    alice.restart()

    assert alice.flow_handle(handle.flow_id).result() == "Pong"


def test_unstarted_flow_survives_restart_before_it_ran(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(PingFlow(bob.party))

    alice.restart()
    net.run_network()

    assert alice.flow_handle(handle.flow_id).result() == "Pong"
    assert results_by_class(bob) == {"PongFlow": 1}
    assert_drained(net)


def test_crash_while_starting_a_flow_loses_nothing_committed(net: MockNetwork) -> None:
    import pytest

    from flows.testing import SimulatedCrash

    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    alice.crash_at("after_commit")
    with pytest.raises(SimulatedCrash):
        alice.start_flow(PingFlow(bob.party))
    (flow_id, _, status) = alice.checkpoints()[0]  # committed before the crash: it survives
    assert status == "UNSTARTED"
    net.run_network()
    assert alice.flow_handle(flow_id).result() == "Pong"

    alice.crash_at("after_PersistCheckpoint")
    with pytest.raises(SimulatedCrash):
        alice.start_flow(PingFlow(bob.party))
    assert alice.checkpoints() == []  # rolled back: it never existed
    assert_drained(net)
