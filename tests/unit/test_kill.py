"""Killing a flow ends it wherever it is; its counterparties see an unexpected end."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows import FOREVER, FlowKilledException
from flows.testing import MockNetwork
from samples.pingpong import PingFlow
from statemachine.state import FlowStatus
from tests.conftest import CORDAPPS
from tests.cordapp import BEHAVIOUR, PatientFlow, ShapeShifterFlow
from tests.helpers import restore_now, results_by_class

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


def network(tmp_path: Path, backend: str = "sqlite") -> MockNetwork:
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=backend)
    net.create_node(ALICE)
    net.create_node(BOB)
    return net


def errors_by_class(net: MockNetwork, index: int) -> dict[str, str]:
    from sqlalchemy import select

    from persistence import schema

    table = schema.node_flow_exceptions
    engine = net.nodes[index].node.database.engine  # type: ignore[union-attr]
    with engine.connect() as connection:
        rows = connection.execute(select(table.c.flow_class, table.c.exception_class)).all()
    return {row.flow_class.rsplit(".", 1)[-1]: row.exception_class for row in rows}


def test_a_suspended_flow_is_killed_and_its_counterparty_ends(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend)
    alice, bob = net.nodes
    handle = alice.start_flow(PatientFlow(bob.party, FOREVER, False))
    net.run_network()
    assert alice.flow_status(handle.flow_id) is FlowStatus.SUSPENDED
    alice.kill_flow(handle.flow_id, "stuck for too long")
    net.run_network()
    with pytest.raises(FlowKilledException, match="stuck for too long"):
        handle.result()
    assert alice.checkpoints() == [] and bob.checkpoints() == []
    # Bob's responder was waiting without limit: it ended with an unexpected end.
    assert errors_by_class(net, 1) == {"SilentResponder": "flows.errors.UnexpectedFlowEndException"}
    assert results_by_class(bob) == {}
    alice.restart()
    with pytest.raises(FlowKilledException):
        alice.flow_handle(handle.flow_id).result()
    net.stop_nodes()


def test_a_hospitalized_flow_can_be_killed(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend)
    alice = net.nodes[0]
    handle = alice.start_flow(ShapeShifterFlow())
    net.run_network(advance_clock=False)
    BEHAVIOUR["shape"] = "changed"
    alice.restart()
    restore_now(alice)  # restored lazily: restore it now to look at it
    net.run_network(advance_clock=False)
    assert alice.flow_status(handle.flow_id) is FlowStatus.HOSPITALIZED
    alice.kill_flow(handle.flow_id)
    net.run_network()
    with pytest.raises(FlowKilledException, match="killed by an operator"):
        handle.result()
    assert alice.checkpoints() == []
    net.stop_nodes()


def test_killing_an_unknown_or_finished_flow_says_so(tmp_path: Path) -> None:
    net = network(tmp_path)
    alice = net.nodes[0]
    with pytest.raises(KeyError, match="not running here"):
        alice.kill_flow("no-such-flow")
    net.stop_nodes()


def test_a_flow_killed_before_its_next_step_runs_does_not_take_it(
    tmp_path: Path, backend: str
) -> None:
    net = network(tmp_path, backend)
    alice, bob = net.nodes
    handle = alice.start_flow(PatientFlow(bob.party, FOREVER, False))
    alice.kill_flow(handle.flow_id, "changed my mind")  # its first step is still pending
    net.run_network()
    with pytest.raises(FlowKilledException, match="changed my mind"):
        handle.result()
    assert alice.checkpoints() == [] and bob.checkpoints() == []
    assert results_by_class(bob) == {}
    net.stop_nodes()


def test_a_flow_killed_while_an_answer_is_queued_ends_cleanly(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend)
    alice, bob = net.nodes
    handle = alice.start_flow(PingFlow(bob.party))
    while not bob.node.manager.statistics.flows_completed:
        net.run_once()  # Bob has answered; Alice has not taken the answer in yet
    alice.kill_flow(handle.flow_id, "too late")
    net.run_network()
    with pytest.raises(FlowKilledException, match="too late"):
        handle.result()
    assert alice.checkpoints() == []
    assert net.messaging.in_flight(alice.node.messaging.my_address) == 0
    net.stop_nodes()
