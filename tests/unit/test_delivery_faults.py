"""Duplicated, reordered, delayed and refused deliveries change nothing."""

from __future__ import annotations

import pytest

from flows.testing import MockNetwork
from messaging.inmemory import Faults
from samples.pingpong import PingFlow
from samples.trade import BuyerFlow
from tests.conftest import CORDAPPS
from tests.cordapp import EchoFlow
from tests.helpers import assert_drained, results_by_class

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"
CAROL = "O=Carol,L=Zurich,C=CH"

FAULTS = {
    "duplicate": Faults(duplicate=0.5),
    "reorder": Faults(reorder=0.8),
    "delay": Faults(delay=0.5, max_delay_steps=4),
    "drop": Faults(drop=0.4),
    "all": Faults(drop=0.2, duplicate=0.3, delay=0.3, reorder=0.5),
}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_faulty_network_gives_fault_free_results(fault: str, seed: int, backend: str) -> None:
    net = MockNetwork(cordapps=CORDAPPS, seed=seed, faults=FAULTS[fault], database=backend)
    try:
        alice, bob, carol = (net.create_node(n) for n in (ALICE, BOB, CAROL))
        pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(5)]
        echo = bob.start_flow(EchoFlow(alice.party, ["x", "yz", "w", "v"]))
        trade = alice.start_flow(BuyerFlow(bob.party, carol.party, "tea", 2, 300))
        net.run_network()

        assert [p.result() for p in pings] == ["Pong"] * 5
        assert echo.result() == ["X", "YZ", "W", "V"]
        assert trade.result().proposal.item == "tea"
        assert results_by_class(bob) == {"PongFlow": 5, "EchoFlow": 1, "SellerFlow": 1}
        assert results_by_class(alice) == {"PingFlow": 5, "EchoResponder": 1, "BuyerFlow": 1}
        assert results_by_class(carol) == {"ApproverFlow": 1}
        assert_drained(net)
        stats = net.messaging.statistics
        injected = {
            "duplicate": stats.duplicated,
            "reorder": stats.reordered,
            "delay": stats.delayed,
            "drop": stats.dropped,
        }
        if fault != "all":
            assert injected[fault] > 0, f"no {fault} fault was injected"
    finally:
        net.stop_nodes()


def test_duplicates_are_dropped_by_id(backend: str) -> None:
    dup = MockNetwork(cordapps=CORDAPPS, seed=1, faults=Faults(duplicate=1.0), database=backend)
    try:
        alice, bob = dup.create_node(ALICE), dup.create_node(BOB)
        handle = alice.start_flow(PingFlow(bob.party))
        dup.run_network()
        assert handle.result() == "Pong"
        dropped = sum(n.node.manager.statistics.duplicates_dropped for n in dup.nodes)
        assert dropped == dup.messaging.statistics.duplicated > 0
        assert results_by_class(bob) == {"PongFlow": 1}
        assert_drained(dup)
    finally:
        dup.stop_nodes()


def test_same_seed_same_schedule() -> None:
    def run(seed: int) -> tuple[object, ...]:
        net = MockNetwork(cordapps=CORDAPPS, seed=seed, faults=FAULTS["all"])
        try:
            alice, bob = net.create_node(ALICE), net.create_node(BOB)
            for _ in range(4):
                alice.start_flow(PingFlow(bob.party))
            rounds = net.run_network()
            return (rounds, net.messaging.statistics)
        finally:
            net.stop_nodes()

    assert run(7) == run(7)
