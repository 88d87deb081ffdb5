"""``FlowLogic.in_transaction``: side effects in the node database, exactly once per flow."""

from __future__ import annotations

import pytest

from flows.node.effects import FlowEffectError
from flows.testing import MockNetwork, MockNode
from tests.conftest import CORDAPPS
from tests.cordapp import LEDGER_METADATA, FailingEffectFlow, PaymentFlow, ledger_entries
from tests.helpers import assert_drained, results_by_class

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


def with_ledger(node: MockNode) -> MockNode:
    LEDGER_METADATA.create_all(node.node.database.engine)  # type: ignore[union-attr]
    return node


def test_each_effect_is_written_once_in_the_transaction_of_its_step(net: MockNetwork) -> None:
    alice = with_ledger(net.create_node(ALICE))
    bob = with_ledger(net.create_node(BOB))
    handles = [alice.start_flow(PaymentFlow(bob.party, amount)) for amount in (10, 20, 30)]
    net.run_network()
    assert [h.result() for h in handles] == ["receipt 10", "receipt 20", "receipt 30"]
    alice_rows = ledger_entries(alice.node.database.engine)  # type: ignore[union-attr]
    for handle, amount in zip(handles, (10, 20, 30), strict=True):
        mine = [entry for flow_id, entry in alice_rows if flow_id == handle.flow_id]
        assert mine == [f"debit {amount}", f"receipt {amount}"]
    bob_rows = ledger_entries(bob.node.database.engine)  # type: ignore[union-attr]
    assert sorted(entry for _, entry in bob_rows) == ["credit 10", "credit 20", "credit 30"]
    assert len({flow_id for flow_id, _ in bob_rows}) == 3
    assert_drained(net)


def test_a_restart_after_the_commit_does_not_run_an_effect_again(net: MockNetwork) -> None:
    alice = with_ledger(net.create_node(ALICE))
    bob = with_ledger(net.create_node(BOB))
    handle = alice.start_flow(PaymentFlow(bob.party, 5))
    net.run_once()  # Alice: debit committed with the checkpoint that waits for the receipt
    alice.restart()  # replay: the journal says the debit was done
    net.run_network()
    assert handle.result() == "receipt 5"
    rows = ledger_entries(alice.node.database.engine)  # type: ignore[union-attr]
    assert rows == [(handle.flow_id, "debit 5"), (handle.flow_id, "receipt 5")]
    assert results_by_class(bob) == {"PayeeFlow": 1}


def test_an_effect_that_raises_rolls_back_its_whole_step(net: MockNetwork) -> None:
    alice = with_ledger(net.create_node(ALICE))
    handle = alice.start_flow(FailingEffectFlow())
    with pytest.raises(
        FlowEffectError, match="side effect 'broken' raised RuntimeError: the effect is broken"
    ):
        net.run_network()
    # Nothing of the step committed: the flow is still at its first checkpoint.
    assert alice.checkpoints() == [(handle.flow_id, "tests.cordapp.FailingEffectFlow", "UNSTARTED")]
    assert results_by_class(alice) == {}


def test_effects_need_a_database() -> None:
    with MockNetwork(cordapps=CORDAPPS, database="memory") as net:
        alice = net.create_node(ALICE)
        bob = net.create_node(BOB)
        alice.start_flow(PaymentFlow(bob.party, 1))
        with pytest.raises(FlowEffectError, match="needs a database"):
            net.run_network()
