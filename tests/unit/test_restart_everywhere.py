"""Crash a node at every boundary of a fault-free run, on every node; nothing may change.

For each scenario, a dry run counts how often each node reaches each crash point
(executor action boundaries, relay boundaries, and every flow suspension). Then, for every
(node, point, occurrence), a fresh network runs the scenario with a crash armed there: the
node dies (open transaction rolled back, memory dropped) and restarts from its database.
Every flow must still finish once, with the fault-free result, leaving nothing behind.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from flows.node.handles import FlowHandle
from flows.testing import MockNetwork
from foundation.serialization import PAYLOADS
from samples.pingpong import PingFlow
from samples.trade import BuyerFlow, TradeOutcome
from tests.conftest import CORDAPPS
from tests.cordapp import LEDGER_METADATA, PaymentFlow, ledger_entries
from tests.helpers import assert_drained, results_by_class, stored_results

NAMES = ["O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US", "O=Carol,L=Zurich,C=CH"]


@attrs.frozen
class Scenario:
    name: str
    node_count: int
    start: Callable[[MockNetwork], list[FlowHandle[Any]]]
    check: Callable[[MockNetwork, list[FlowHandle[Any]]], None]


def _start_pingpong(net: MockNetwork) -> list[FlowHandle[Any]]:
    alice, bob = net.nodes
    return [alice.start_flow(PingFlow(bob.party))]


def _check_pingpong(net: MockNetwork, handles: list[FlowHandle[Any]]) -> None:
    alice, bob = net.nodes
    assert [h.result() for h in handles] == ["Pong"]
    assert results_by_class(alice) == {"PingFlow": 1}
    assert results_by_class(bob) == {"PongFlow": 1}


def _start_trade(net: MockNetwork) -> list[FlowHandle[Any]]:
    buyer, seller, approver = net.nodes
    return [
        buyer.start_flow(BuyerFlow(seller.party, approver.party, "widget", 3, 250)),
        buyer.start_flow(BuyerFlow(seller.party, approver.party, "yacht", 1, 10**9)),
    ]


def _check_trade(net: MockNetwork, handles: list[FlowHandle[Any]]) -> None:
    buyer, seller, approver = net.nodes
    outcome = handles[0].result()
    assert isinstance(outcome, TradeOutcome)
    assert (outcome.proposal.item, outcome.proposal.quantity) == ("widget", 3)
    assert outcome.decision.approved
    with pytest.raises(Exception, match="trade refused by O=Carol"):
        handles[1].result()
    # exactly once: one seller result, and it is the very trade the buyer got (same uuid)
    assert results_by_class(buyer) == {"BuyerFlow": 1}
    assert results_by_class(seller) == {"SellerFlow": 1}
    assert results_by_class(approver) == {"ApproverFlow": 2}
    (seller_result,) = stored_results(seller, "SellerFlow")
    assert PAYLOADS.decode(seller_result) == outcome


def _start_payments(net: MockNetwork) -> list[FlowHandle[Any]]:
    payer, payee = net.nodes
    for node in net.nodes:
        LEDGER_METADATA.create_all(node.node.database.engine)  # type: ignore[union-attr]
    return [payer.start_flow(PaymentFlow(payee.party, amount)) for amount in (7, 8)]


def _check_payments(net: MockNetwork, handles: list[FlowHandle[Any]]) -> None:
    payer, payee = net.nodes
    assert [h.result() for h in handles] == ["receipt 7", "receipt 8"]
    rows = ledger_entries(payer.node.database.engine)  # type: ignore[union-attr]
    for handle, amount in zip(handles, (7, 8), strict=True):
        mine = [entry for flow_id, entry in rows if flow_id == handle.flow_id]
        assert mine == [f"debit {amount}", f"receipt {amount}"], rows
    payee_rows = ledger_entries(payee.node.database.engine)  # type: ignore[union-attr]
    assert sorted(entry for _, entry in payee_rows) == ["credit 7", "credit 8"], payee_rows
    assert results_by_class(payee) == {"PayeeFlow": 2}


SCENARIOS = {
    "pingpong": Scenario("pingpong", 2, _start_pingpong, _check_pingpong),
    "trade": Scenario("trade", 3, _start_trade, _check_trade),
    "payments": Scenario("payments", 2, _start_payments, _check_payments),
}


def _network(scenario: Scenario, directory: Path, database: str = "sqlite") -> MockNetwork:
    net = MockNetwork(cordapps=CORDAPPS, directory=directory, database=database)
    for name in NAMES[: scenario.node_count]:
        net.create_node(name)
    return net


def _crash_points(scenario: Scenario) -> list[tuple[int, str, int]]:
    with tempfile.TemporaryDirectory() as directory:
        net = _network(scenario, Path(directory))
        handles = scenario.start(net)
        for node in net.nodes:
            node.boundary_counts.clear()
        net.run_network()
        scenario.check(net, handles)
        points = [
            (index, point, nth)
            for index, node in enumerate(net.nodes)
            for point, count in sorted(node.boundary_counts.items())
            for nth in range(1, count + 1)
        ]
        net.stop_nodes()
    return points


CASES = [
    pytest.param(name, index, point, nth, id=f"{name}-node{index}-{point}-{nth}")
    for name, scenario in SCENARIOS.items()
    for index, point, nth in _crash_points(scenario)
]


def test_every_kind_of_crash_point_is_exercised() -> None:
    points = {case.values[2] for case in CASES}
    for expected in [
        "before_transaction",
        "after_PersistCheckpoint",
        "after_RecordInboundMessages",
        "after_WriteOutbox",
        "after_RunFlowEffects",
        "after_RemoveCheckpoint",
        "after_StoreFlowResult",
        "after_StoreFlowError",
        "after_commit",
        "after_AcknowledgeMessages",
        "after_HandOffMessages",
        "after_hand_off",
        "after_outbox_delete",
        "flow_suspended",
    ]:
        assert expected in points


@pytest.mark.parametrize(("scenario_name", "node_index", "point", "nth"), CASES)
def test_crash_and_resume(
    scenario_name: str, node_index: int, point: str, nth: int, tmp_path: Path, backend: str
) -> None:
    scenario = SCENARIOS[scenario_name]
    net = _network(scenario, tmp_path, backend)
    try:
        handles = scenario.start(net)
        victim = net.nodes[node_index]
        victim.crash_at(point, nth)
        net.run_network()
        assert victim.crashes == 1, f"the crash at {point} #{nth} never happened"
        scenario.check(net, handles)
        assert_drained(net)
    finally:
        net.stop_nodes()


def _round_count(scenario: Scenario) -> int:
    with tempfile.TemporaryDirectory() as directory:
        net = _network(scenario, Path(directory))
        scenario.start(net)
        rounds = net.run_network()
        net.stop_nodes()
    return rounds


ROUND_CASES = [
    pytest.param(name, index, after, id=f"{name}-node{index}-after-round-{after}")
    for name, scenario in SCENARIOS.items()
    for index in range(scenario.node_count)
    for after in range(_round_count(scenario) + 1)
]


@pytest.mark.parametrize(("scenario_name", "node_index", "after_rounds"), ROUND_CASES)
def test_restart_between_rounds(
    scenario_name: str, node_index: int, after_rounds: int, tmp_path: Path, backend: str
) -> None:
    scenario = SCENARIOS[scenario_name]
    net = _network(scenario, tmp_path, backend)
    try:
        handles = scenario.start(net)
        for _ in range(after_rounds):
            net.run_once()
        net.nodes[node_index].restart()
        net.run_network()
        scenario.check(net, handles)
        assert_drained(net)
    finally:
        net.stop_nodes()


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize(("scenario_name", "node_index", "after_rounds"), ROUND_CASES)
def test_crash_during_replay_after_a_restart(
    scenario_name: str,
    node_index: int,
    after_rounds: int,
    nth: int,
    tmp_path: Path,
    backend: str,
) -> None:
    scenario = SCENARIOS[scenario_name]
    net = _network(scenario, tmp_path, backend)
    try:
        handles = scenario.start(net)
        for _ in range(after_rounds):
            net.run_once()
        victim = net.nodes[node_index]
        victim.restart()
        victim.crash_at("during_replay", nth)  # if that much replays, die in the middle of it
        net.run_network()
        scenario.check(net, handles)
        assert_drained(net)
    finally:
        net.stop_nodes()


def test_a_crash_during_replay_replays_again(tmp_path: Path) -> None:
    net = _network(SCENARIOS["trade"], tmp_path)
    try:
        handles = SCENARIOS["trade"].start(net)
        seller = net.nodes[1]
        while not any(status == "SUSPENDED" for _, _, status in seller.checkpoints()):
            net.run_once()  # until the seller waits (for the approval) with a journal
        seller.restart()
        seller.crash_at("during_replay", 1)
        net.run_network()
        assert seller.crashes == 1, "the seller had a suspended flow to replay"
        _check_trade(net, handles)
        assert_drained(net)
    finally:
        net.stop_nodes()
