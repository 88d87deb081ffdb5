"""Starting several flows at once: one transaction for all, or none started."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows import FlowArgumentError
from flows.testing import MockNetwork
from samples.pingpong import PingFlow


@pytest.fixture
def net(tmp_path: Path) -> MockNetwork:
    return MockNetwork(cordapps=["samples.pingpong"], directory=tmp_path)


def test_several_flows_start_in_one_transaction_and_all_complete(net: MockNetwork) -> None:
    alice = net.create_node("O=Alice,L=London,C=GB")
    bob = net.create_node("O=Bob,L=New York,C=US")
    before = alice.node.manager.executor.transactions
    handles = alice.start_flows([PingFlow(bob.party) for _ in range(5)])
    assert alice.node.manager.executor.transactions == before + 1
    assert len({h.flow_id for h in handles}) == 5
    assert len(alice.checkpoints()) == 5  # all five committed before running
    net.run_network()
    assert [h.result() for h in handles] == ["Pong"] * 5
    net.stop_nodes()


def test_one_flow_that_cannot_start_starts_none(net: MockNetwork) -> None:
    alice = net.create_node("O=Alice,L=London,C=GB")
    bob = net.create_node("O=Bob,L=New York,C=US")
    before = alice.node.manager.executor.transactions
    with pytest.raises(FlowArgumentError, match="argument 1 cannot be checkpointed"):
        alice.start_flows([PingFlow(bob.party), PingFlow(object())])  # type: ignore[arg-type]
    assert alice.node.manager.executor.transactions == before
    assert alice.checkpoints() == []
    net.stop_nodes()


def test_new_flow_ids_are_distinct_version_4_uuids() -> None:
    """Flow ids drawn in one read of the system's randomness are still UUID4s, all different."""
    import uuid

    from flows.node.node import new_flow_ids

    ids = new_flow_ids(1000)
    assert len(set(ids)) == 1000
    for flow_id in ids:
        parsed = uuid.UUID(flow_id)
        assert parsed.hex == flow_id
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
    assert new_flow_ids(0) == []
