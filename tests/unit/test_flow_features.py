"""Errors, rejected sessions, sub flows, receive_all, sleep, journaled values."""

from __future__ import annotations

import pytest

from flows import FlowException, FlowStillRunningError, UnexpectedFlowEndException
from flows.testing import MockNetwork
from tests.cordapp import (
    CollectQuotesFlow,
    EchoFlow,
    FailingInitiator,
    InsufficientFundsException,
    JournaledValuesFlow,
    ParentFlow,
    Quote,
    SleepyFlow,
    UnansweredFlow,
    WrongTypeFlow,
)
from tests.helpers import assert_drained, results_by_class

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"
CAROL = "O=Carol,L=Zurich,C=CH"


def test_multi_step_conversation(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(EchoFlow(bob.party, ["a", "bc", "def"]))
    net.run_network()
    assert handle.result() == ["A", "BC", "DEF"]
    assert_drained(net)


def test_flow_exception_reaches_the_counterparty_with_its_message(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(FailingInitiator(bob.party, "flow_exception"))
    net.run_network()
    with pytest.raises(FlowException, match="no can do: the vault is empty"):
        handle.result()
    assert_drained(net)


def test_flow_exception_subclass_keeps_its_class(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(FailingInitiator(bob.party, "subclass"))
    net.run_network()
    with pytest.raises(InsufficientFundsException, match="balance 12 < 40"):
        handle.result()


def test_internal_error_reaches_the_counterparty_without_detail(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(FailingInitiator(bob.party, "internal"))
    net.run_network()
    with pytest.raises(UnexpectedFlowEndException) as caught:
        handle.result()
    assert "internal error" in str(caught.value)
    assert "deadbeef" not in str(caught.value)
    assert "KeyError" not in str(caught.value)
    assert_drained(net)


def test_responder_ending_early_is_an_unexpected_end(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(FailingInitiator(bob.party, "end"))
    net.run_network()
    with pytest.raises(UnexpectedFlowEndException, match="completed without sending data"):
        handle.result()


def test_failed_flow_error_is_kept_across_restart(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(FailingInitiator(bob.party, "flow_exception"))
    net.run_network()
    alice.restart()
    with pytest.raises(FlowException, match="vault is empty"):
        alice.flow_handle(handle.flow_id).result()


def test_unknown_responder_is_rejected_naming_the_flow(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    bob = net.create_node(BOB, cordapps=["samples.pingpong"])  # lacks tests.cordapp
    handle = alice.start_flow(UnansweredFlow(bob.party))
    net.run_network()
    with pytest.raises(UnexpectedFlowEndException, match=r"tests\.cordapp\.UnansweredFlow"):
        handle.result()
    assert bob.node.manager.statistics.sessions_rejected == 1
    assert_drained(net)


def test_receive_checks_the_payload_type(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(WrongTypeFlow(bob.party))
    net.run_network()
    with pytest.raises(FlowException, match="expected int .* but received str"):
        handle.result()


def test_inlined_and_initiating_sub_flows(net: MockNetwork) -> None:
    alice, bob, carol = net.create_node(ALICE), net.create_node(BOB), net.create_node(CAROL)
    handle = alice.start_flow(ParentFlow(bob.party, carol.party))
    net.run_network()
    assert handle.result() == ("hi from Bob", "child seen by Carol")
    assert results_by_class(bob) == {"ParentResponder": 1}
    assert results_by_class(carol) == {"ChildResponder": 1}
    assert_drained(net)


def test_receive_all_returns_in_session_order_whatever_the_arrival(backend: str) -> None:
    from messaging.inmemory import Faults
    from tests.conftest import CORDAPPS

    for seed in range(5):
        faults = Faults(reorder=0.7, delay=0.3)
        net = MockNetwork(cordapps=CORDAPPS, seed=seed, faults=faults, database=backend)
        try:
            alice = net.create_node(ALICE)
            suppliers = [net.create_node(n) for n in (BOB, CAROL, "O=Dave,L=Oslo,C=NO")]
            handle = alice.start_flow(CollectQuotesFlow([s.party for s in reversed(suppliers)]))
            net.run_network()
            assert handle.result() == [Quote("Dave", 104), Quote("Carol", 105), Quote("Bob", 103)]
            assert_drained(net)
        finally:
            net.stop_nodes()


def test_sleep_survives_a_restart_and_keeps_its_deadline(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    handle = alice.start_flow(SleepyFlow(60))
    net.run_network(advance_clock=False)
    ((_, _, status),) = alice.checkpoints()
    assert status == "SUSPENDED"
    with pytest.raises(FlowStillRunningError):
        handle.result()

    net.clock.advance(45)
    alice.restart()
    net.run_network(advance_clock=False)
    assert alice.checkpoints()[0][2] == "SUSPENDED"  # 45 of 60 seconds: still asleep

    net.clock.advance(15)
    net.run_network(advance_clock=False)
    assert handle.result() == 60.0  # the deadline was not reset by the restart
    assert_drained(net)


def test_journaled_values_are_the_same_after_replay(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    started_at = net.clock.now()
    handle = alice.start_flow(JournaledValuesFlow())
    net.run_network(advance_clock=False)
    state = alice.node.manager.flow_state(handle.flow_id)
    assert state is not None
    journaled = [entry.outcome.value for entry in state.checkpoint.journal]  # type: ignore[union-attr]

    net.clock.advance(1)
    alice.restart()
    net.run_network()

    now, uuid, rand = handle.result()
    assert [now, uuid, rand] == journaled
    assert now == started_at  # the time of the first run, not the time of the replay
    assert net.clock.now() == started_at + 5
