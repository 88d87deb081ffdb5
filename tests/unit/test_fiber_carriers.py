"""Carrier greenlets (``flows.node.fiber``): one greenlet runs flow after flow, keeping none."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.node import fiber
from flows.testing import MockNetwork, MockNode
from samples.pingpong import PingFlow
from tests.cordapp import ContextVarFlow, SleepyFlow

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


@pytest.fixture
def network(tmp_path: Path) -> Iterator[tuple[MockNetwork, MockNode, MockNode]]:
    """Alice and Bob on the in-memory test network, with the pingpong and test CorDapps."""
    net = MockNetwork(
        cordapps=["samples.pingpong", "tests.cordapp"], directory=tmp_path, database="memory"
    )
    try:
        yield net, net.create_node(ALICE), net.create_node(BOB)
    finally:
        net.stop_nodes()


def test_carriers_are_reused_from_one_wave_of_flows_to_the_next(
    network: tuple[MockNetwork, MockNode, MockNode],
) -> None:
    """A second wave runs on the carriers the first left idle: the pool does not grow."""
    net, alice, bob = network
    fiber._CARRIERS.idle.clear()
    first = alice.start_flows([PingFlow(bob.party) for _ in range(20)])
    net.run_network()
    assert all(handle.result() == "Pong" for handle in first)
    after_first = {id(carrier) for carrier in fiber._CARRIERS.idle}
    assert len(after_first) >= 2  # at least a ping and a pong ran side by side
    second = alice.start_flows([PingFlow(bob.party) for _ in range(20)])
    net.run_network()
    assert all(handle.result() == "Pong" for handle in second)
    assert {id(carrier) for carrier in fiber._CARRIERS.idle} == after_first


def test_a_flow_never_sees_the_context_another_flow_set(
    network: tuple[MockNetwork, MockNode, MockNode],
) -> None:
    """Each flow starts with an empty contextvars context, kept across its suspensions."""
    net, alice, _ = network
    for wave in range(3):  # later waves run on carriers earlier flows used
        handles = [alice.start_flow(ContextVarFlow(f"w{wave}-{i}")) for i in range(5)]
        net.run_network()
        assert [h.result() for h in handles] == [("unset", f"w{wave}-{i}") for i in range(5)]


def test_an_aborted_flow_gives_its_carrier_back_and_is_freed(
    network: tuple[MockNetwork, MockNode, MockNode],
) -> None:
    """Killing a suspended flow unwinds only its frames: its carrier runs the next flow."""
    net, alice, bob = network
    fiber._CARRIERS.idle.clear()
    sleeper = alice.start_flow(SleepyFlow(3600))
    net.run_network(advance_clock=False)
    assert not fiber._CARRIERS.idle  # its carrier is busy with the sleeping flow
    runtime = alice.node.manager._flows.get(sleeper.flow_id)
    assert runtime is not None and runtime.fiber is not None
    carrier = runtime.fiber._greenlet  # type: ignore[attr-defined]
    sleeping_fiber = weakref.ref(runtime.fiber)
    del runtime
    alice.kill_flow(sleeper.flow_id)
    net.run_network(advance_clock=False)
    assert fiber._CARRIERS.idle == [carrier]
    gc.collect()
    assert sleeping_fiber() is None
    after = alice.start_flow(PingFlow(bob.party))
    net.run_network()
    assert after.result() == "Pong"


def test_ended_flows_leave_no_cyclic_garbage(
    network: tuple[MockNetwork, MockNode, MockNode],
) -> None:
    """With the collector off, finished ping/pongs are freed by reference counting alone."""
    net, alice, bob = network
    warm = alice.start_flows([PingFlow(bob.party) for _ in range(10)])
    net.run_network()
    assert all(handle.result() == "Pong" for handle in warm)
    gc.collect()
    gc.disable()
    try:
        handles = alice.start_flows([PingFlow(bob.party) for _ in range(50)])
        net.run_network()
        assert all(handle.result() == "Pong" for handle in handles)
        del handles
        assert gc.collect() == 0
    finally:
        gc.enable()
