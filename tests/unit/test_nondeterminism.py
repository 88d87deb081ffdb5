"""A flow that asks for something else on replay is caught, named, and kept (hospitalized)."""

from __future__ import annotations

import pytest

from flows import FlowHospitalizedError
from flows.testing import MockNetwork
from statemachine.flow_error import ErrorKind
from tests import cordapp
from tests.cordapp import ShapeShifterFlow

ALICE = "O=Alice,L=London,C=GB"


def test_divergent_replay_is_hospitalized_not_lost(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    handle = alice.start_flow(ShapeShifterFlow())
    net.run_network(advance_clock=False)
    assert alice.checkpoints() == [(handle.flow_id, "tests.cordapp.ShapeShifterFlow", "SUSPENDED")]

    cordapp.BEHAVIOUR["shape"] = "changed"  # the code now takes another path
    alice.restart()
    net.run_network()

    assert alice.checkpoints() == [
        (handle.flow_id, "tests.cordapp.ShapeShifterFlow", "HOSPITALIZED")
    ]
    with pytest.raises(FlowHospitalizedError) as caught:
        handle.result()
    message = str(caught.value)
    assert "step 1" in message
    assert "RecordValue('uuid')" in message
    assert "random()" in message
    state = alice.node.manager.flow_state(handle.flow_id)
    assert state is not None and state.checkpoint.error is not None
    assert state.checkpoint.error.kind is ErrorKind.NON_DETERMINISM
    assert alice.node.manager.statistics.flows_hospitalized == 1


def test_hospitalized_flow_stays_hospitalized_across_restarts(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    handle = alice.start_flow(ShapeShifterFlow())
    net.run_network(advance_clock=False)
    cordapp.BEHAVIOUR["shape"] = "changed"
    alice.restart()
    net.run_network()

    cordapp.BEHAVIOUR.clear()  # even with the original code back, it waits for an operator
    alice.restart()
    net.run_network()

    assert alice.checkpoints()[0][2] == "HOSPITALIZED"
    with pytest.raises(FlowHospitalizedError):
        handle.result()


def test_same_code_replays_cleanly(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    handle = alice.start_flow(ShapeShifterFlow())
    net.run_network(advance_clock=False)
    alice.restart()
    net.run_network()
    assert handle.result() == "done"
    assert alice.checkpoints() == []
