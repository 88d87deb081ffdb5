"""Hibernation and lazy restore: waiting flows give up their memory and come back unchanged.

A hibernated (or not yet restored) flow is *dormant*: only its id is in memory. A message for
one of its sessions, its deadline or an operator's command restores it from its checkpoint,
and replay brings it back to where it waited without writing anything.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from flows import FlowKilledException, UnexpectedFlowEndException
from flows.testing import MockNode
from samples.pingpong import PingFlow
from statemachine.hibernation import HibernationPolicy, IdleFlows, MemoryBudget
from statemachine.state import FlowStatus
from tests.cordapp import PatientFlow, SleepyFlow
from tests.unit.test_timeouts import network  # Alice and Bob on a MockNetwork


def counts(node: MockNode) -> tuple[int, int]:
    """(in memory, dormant) flows of ``node``."""
    found = node.node.manager.flow_counts()
    return found.in_memory, found.dormant


def test_ping_pong_runs_with_every_waiting_flow_hibernated(tmp_path: Path, backend: str) -> None:
    net = network(tmp_path, backend, hibernate_after=0)
    alice, bob = net.nodes
    handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(5)]
    net.run_network()
    assert [handle.result() for handle in handles] == ["Pong"] * 5
    statistics = alice.node.manager.statistics
    assert statistics.flows_hibernated == 5  # each ping waited for its pong once
    assert statistics.flows_woken == 5  # ... and its pong woke it
    assert counts(alice) == (0, 0) and counts(bob) == (0, 0)
    assert alice.checkpoints() == [] and bob.checkpoints() == []
    net.stop_nodes()


def test_a_hibernated_flow_is_woken_by_its_timer(tmp_path: Path) -> None:
    net = network(tmp_path, hibernate_after=0)
    alice, _ = net.nodes
    handle = alice.start_flow(SleepyFlow(30.0))
    net.run_network(advance_clock=False)
    assert counts(alice) == (0, 1)
    assert alice.flow_status(handle.flow_id) is FlowStatus.SUSPENDED
    net.run_network()  # the clock jumps to the deadline the dormant flow still has
    assert handle.result() == pytest.approx(30.0)
    assert alice.node.manager.statistics.flows_woken == 1
    net.stop_nodes()


def test_a_hibernated_receive_still_times_out_on_its_first_deadline(tmp_path: Path) -> None:
    net = network(tmp_path, hibernate_after=0)
    alice, bob = net.nodes
    started = net.clock.now()
    handle = alice.start_flow(PatientFlow(bob.party, 30.0, True))
    net.run_network()
    assert handle.result().startswith("gave up")
    assert net.clock.now() - started == pytest.approx(30.0)
    net.stop_nodes()


def test_flows_wait_in_memory_until_they_have_been_idle_long_enough(tmp_path: Path) -> None:
    net = network(tmp_path, hibernate_after=60)
    alice, bob = net.nodes
    handle = alice.start_flow(PatientFlow(bob.party, None, True))
    net.run_network(advance_clock=False)
    assert counts(alice) == (1, 0)  # waiting, but not for long yet
    net.clock.advance(59.0)
    net.run_network(advance_clock=False)
    assert counts(alice) == (1, 0)
    net.clock.advance(1.0)
    net.run_network(advance_clock=False)
    assert counts(alice) == (0, 1) and counts(bob) == (0, 1)  # both ends hibernated
    alice.kill_flow(handle.flow_id)  # an operator's command wakes it, then kills it
    net.run_network(advance_clock=False)
    with pytest.raises(FlowKilledException):
        handle.result()
    assert counts(alice) == (0, 0) and counts(bob) == (0, 0)  # bob's responder was told
    net.stop_nodes()


def test_a_counterparty_of_a_killed_hibernated_flow_sees_the_end(tmp_path: Path) -> None:
    net = network(tmp_path, hibernate_after=0)
    alice, bob = net.nodes
    handle = alice.start_flow(PatientFlow(bob.party, None, False))
    net.run_network(advance_clock=False)
    (responder,) = [flow_id for flow_id, _, _ in bob.checkpoints()]
    bob.kill_flow(responder)
    net.run_network(advance_clock=False)
    with pytest.raises(UnexpectedFlowEndException):
        handle.result()
    net.stop_nodes()


def test_a_paused_flow_is_kept_in_memory_and_runs_after_its_resume(tmp_path: Path) -> None:
    net = network(tmp_path, hibernate_after=0)
    alice, _ = net.nodes
    handle = alice.start_flow(SleepyFlow(5.0))
    net.run_network(advance_clock=False)
    assert counts(alice) == (0, 1)
    alice.pause_flow(handle.flow_id)  # wakes it: a paused flow stays in memory
    net.clock.advance(10.0)
    net.run_network(advance_clock=False)
    assert counts(alice) == (1, 0)
    assert alice.flow_status(handle.flow_id) is not FlowStatus.COMPLETED
    alice.resume_flow(handle.flow_id)
    net.run_network(advance_clock=False)
    assert handle.result() == pytest.approx(10.0)
    net.stop_nodes()


def test_a_restarted_node_restores_waiting_flows_only_when_needed(
    tmp_path: Path, backend: str
) -> None:
    net = network(tmp_path, backend, hibernate_after=0)  # everything they took in is committed
    alice, bob = net.nodes
    patient = [alice.start_flow(PatientFlow(bob.party, 300.0, True)) for _ in range(3)]
    net.run_network(advance_clock=False)
    alice.restart()
    bob.restart()
    assert counts(alice) == (0, 3) and counts(bob) == (0, 3)
    ping = alice.start_flow(PingFlow(bob.party))  # served at once, the others still dormant
    net.run_network(advance_clock=False)
    assert ping.result() == "Pong"
    assert all(alice.node.manager.is_dormant(handle.flow_id) for handle in patient)
    assert alice.node.manager.statistics.flows_restored == 1  # the ping, woken by its pong
    assert bob.node.manager.statistics.flows_restored == 0
    assert alice.node.database.checkpoints.checkpoints_written == 2  # the ping's own two
    net.run_network()  # the deadlines, kept while dormant, wake them
    assert [handle.result()[:7] for handle in patient] == ["gave up"] * 3
    assert alice.node.manager.statistics.flows_woken == 1 + 3  # the ping, and the three
    net.stop_nodes()


def test_a_restored_flow_that_replays_to_where_it_waited_writes_nothing(
    tmp_path: Path, backend: str
) -> None:
    net = network(tmp_path, backend, hibernate_after=0)
    alice, bob = net.nodes
    handles = [alice.start_flow(PatientFlow(bob.party, None, True)) for _ in range(3)]
    sleeper = alice.start_flow(SleepyFlow(100.0))
    net.run_network(advance_clock=False)
    before = {flow_id: status for flow_id, _, status in alice.checkpoints()}
    alice.restart()
    bob.restart()
    assert alice.node.manager.dormancy.restore_all() == 4
    assert bob.node.manager.dormancy.restore_all() == 3
    net.run_network(advance_clock=False)  # replayed to where they waited (and hibernated)
    assert alice.node.database.checkpoints.checkpoints_written == 0
    assert bob.node.database.checkpoints.checkpoints_written == 0
    assert {flow_id: status for flow_id, _, status in alice.checkpoints()} == before
    net.clock.advance(100.0)
    net.run_network(advance_clock=False)
    assert sleeper.result() == pytest.approx(100.0)
    assert all(alice.flow_status(h.flow_id) is FlowStatus.SUSPENDED for h in handles)
    net.stop_nodes()


def test_a_flow_restored_with_news_commits_it_at_the_end_of_its_replay(tmp_path: Path) -> None:
    net = network(tmp_path)  # no hibernation: the confirms stay uncommitted, unacknowledged
    alice, bob = net.nodes
    handles = [alice.start_flow(PatientFlow(bob.party, None, True)) for _ in range(2)]
    net.run_network(advance_clock=False)
    alice.restart()  # the transport delivers the confirms again: they wake the flows
    net.run_network(advance_clock=False)
    assert alice.node.manager.statistics.flows_woken == 2
    assert alice.node.database.checkpoints.checkpoints_written == 2  # each took one in
    assert all(alice.flow_status(h.flow_id) is FlowStatus.SUSPENDED for h in handles)
    net.stop_nodes()


def test_runnable_flows_are_restored_in_the_background_after_a_restart(tmp_path: Path) -> None:
    net = network(tmp_path)
    alice, bob = net.nodes
    with alice.crashes_paused():
        handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(150)]
    alice.restart()  # before any ran: 150 unstarted flows, none waiting
    manager = alice.node.manager
    assert manager.dormancy.restoring() == 150
    alice.run_once()
    assert manager.dormancy.restoring() == 150 - 64  # a batch a round: new work is not held up
    net.run_network()
    assert [handle.result() for handle in handles] == ["Pong"] * 150
    net.stop_nodes()


def test_a_memory_budget_hibernates_every_waiting_flow(tmp_path: Path) -> None:
    net = network(tmp_path)
    alice, bob = net.nodes
    alice.config = attrs.evolve(alice.config, memory_budget_mb=1)  # this process is over it
    alice.restart()
    handles = [alice.start_flow(PatientFlow(bob.party, None, True)) for _ in range(3)]
    net.run_network(advance_clock=False)
    assert counts(alice) == (0, 3)
    assert counts(bob) == (3, 0)  # bob has no budget and no idle time
    for handle in handles:
        alice.kill_flow(handle.flow_id)
    net.run_network(advance_clock=False)
    assert counts(alice) == (0, 0) and counts(bob) == (0, 0)
    net.stop_nodes()


def test_idle_flows_come_out_oldest_first() -> None:
    idle = IdleFlows()
    idle.suspended("a", 1.0)
    idle.suspended("b", 2.0)
    idle.suspended("c", 3.0)
    idle.suspended("a", 4.0)  # suspended again: the newest now
    idle.discard("c")
    assert idle.take_idle_since(2.5) == ["b"]
    assert idle.take_idle_since(None) == ["a"]
    assert len(idle) == 0


def test_the_memory_budget_is_read_at_most_once_a_second() -> None:
    readings = iter([10, 1, 10])
    now = [0.0]
    policy = HibernationPolicy(memory_budget_bytes=5, resident_bytes=lambda: next(readings))
    budget = MemoryBudget(policy, lambda: now[0])
    assert budget.over()  # 10 > 5
    now[0] = 0.5
    assert budget.over()  # not read again yet
    now[0] = 1.0
    assert not budget.over()  # 1
    now[0] = 2.0
    assert budget.over()


def test_a_bad_hibernation_setting_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="idle_seconds must be a number of at least 0"):
        HibernationPolicy(idle_seconds=-1)
    with pytest.raises(ValueError, match="needs resident_bytes"):
        HibernationPolicy(memory_budget_bytes=10)
