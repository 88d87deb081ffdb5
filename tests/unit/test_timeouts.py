"""Receive timeouts: durable deadlines that raise FlowTimeoutException, across restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows import FlowTimeoutException
from flows.testing import MockNetwork
from samples.pingpong import PingFlow
from statemachine.session_ids import (
    identity_tag,
    initiator_session_id,
)
from statemachine.state import FlowStatus
from tests.conftest import CORDAPPS
from tests.cordapp import PatientFlow

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


def network(tmp_path: Path, backend: str = "sqlite", **options: object) -> MockNetwork:
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=backend, **options)  # type: ignore[arg-type]
    net.create_node(ALICE)
    net.create_node(BOB)
    return net


def test_a_receive_times_out_and_the_flow_can_handle_it(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend)
    alice, bob = net.nodes
    handle = alice.start_flow(PatientFlow(bob.party, 30.0, True))
    started = net.clock.now()
    net.run_network()
    session = initiator_session_id(handle.flow_id, 0, identity_tag(ALICE))
    assert handle.result() == f"gave up: no message on {session} within 30 s"
    assert net.clock.now() - started == pytest.approx(30.0)
    net.stop_nodes()


def test_an_unhandled_timeout_fails_the_flow_with_flow_timeout_exception(
    tmp_path: Path, backend: str
) -> None:
    net = network(tmp_path, backend)
    alice, bob = net.nodes
    handle = alice.start_flow(PatientFlow(bob.party, 5.0, False))
    net.run_network()
    with pytest.raises(FlowTimeoutException, match="within 5 s"):
        handle.result()
    net.stop_nodes()


def test_the_deadline_survives_a_restart(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend)
    alice, bob = net.nodes
    handle = alice.start_flow(PatientFlow(bob.party, 60.0, True))
    net.run_network(advance_clock=False)
    assert alice.flow_status(handle.flow_id) is FlowStatus.SUSPENDED
    net.clock.advance(59.0)
    alice.restart()
    net.run_network(advance_clock=False)
    assert alice.flow_status(handle.flow_id) is FlowStatus.SUSPENDED  # not restarted from 0
    net.clock.advance(1.0)
    net.run_network(advance_clock=False)
    assert handle.result().startswith("gave up")
    net.stop_nodes()


def test_a_timeout_replays_as_a_timeout(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend)
    alice, bob = net.nodes
    started = net.clock.now()
    handle = alice.start_flow(PatientFlow(bob.party, 10.0, True, linger=5.0))
    net.run_network(advance_clock=False)
    net.clock.advance(10.0)
    net.run_network(advance_clock=False)  # timed out; now sleeping, the timeout journaled
    ((_, _, status),) = alice.checkpoints()
    assert status == "SUSPENDED"
    alice.restart()  # replay answers the receive with the journaled timeout, at once
    net.run_network()
    session = initiator_session_id(handle.flow_id, 0, identity_tag(ALICE))
    assert handle.result() == f"gave up: no message on {session} within 10 s"
    assert net.clock.now() - started == pytest.approx(15.0)
    net.stop_nodes()


def test_the_node_default_applies_when_the_flow_gives_none(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend, receive_timeout=7.0)
    alice, bob = net.nodes
    started = net.clock.now()
    handle = alice.start_flow(PatientFlow(bob.party, None, True))
    net.run_network()
    assert handle.result().endswith("within 7 s")
    assert net.clock.now() - started == pytest.approx(7.0)
    net.stop_nodes()


def test_forever_means_no_deadline(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend, receive_timeout=None)
    alice, bob = net.nodes
    handle = alice.start_flow(PatientFlow(bob.party, None, True))
    net.run_network()  # would jump to any deadline; there is none
    assert alice.flow_status(handle.flow_id) is FlowStatus.SUSPENDED
    assert alice.node.next_deadline() is None
    net.stop_nodes()


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_timeout_must_be_positive(bad: float) -> None:
    from statemachine.iorequests import Receive

    with pytest.raises(ValueError, match="must be positive"):
        Receive(("s",), bad)


def test_deadlines_of_finished_waits_are_not_kept(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(50)]
    net.run_network(advance_clock=False)
    assert [h.result() for h in handles] == ["Pong"] * 50
    for node in (alice, bob):  # every receive had a (one hour) deadline; none is pending
        assert node.node.manager.next_deadline() is None
        assert node.node.manager.pending_timers() == 0
