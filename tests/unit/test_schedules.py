"""Scheduled flows: once, every so many seconds, by cron; once per slot across restarts.

The decisions (which slot is due, what a missed slot does) are pure and tested alone; the
rest runs on the test network's nodes, on SQLite and PostgreSQL, with the mock clock.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows import FlowLogic, Party
from flows.cli.main import main
from flows.node.client import NodeClient
from flows.node.schedules import (
    GRACE_SECONDS,
    Firing,
    ScheduleError,
    plan_firing,
    slot_after,
    slot_request_id,
)
from flows.testing import MockNetwork, MockNode
from persistence import schema
from persistence.schedule_store import ScheduleExistsError, ScheduleRow
from persistence.store import NodeDatabase
from samples.pingpong import PingFlow

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


def row(kind: str, spec: str, next_slot: float | None, missed: str = "skip") -> ScheduleRow:
    return ScheduleRow("s", "app.Flow", b"", kind, spec, missed, next_slot, False, 0, None, 0.0)


def test_a_due_slot_fires_and_the_schedule_moves_on() -> None:
    assert plan_firing(row("every", "10.0", 100.0), 99.0) is None
    assert plan_firing(row("every", "10.0", 100.0), 100.0) == Firing(100.0, 110.0)
    assert plan_firing(row("every", "10.0", 100.0), 105.0) == Firing(100.0, 110.0)
    assert plan_firing(row("once", "100.0", 100.0), 130.0) == Firing(100.0, None)


def test_missed_slots_are_skipped_or_caught_up_once() -> None:
    late = 100.0 + 10 * 3600 + GRACE_SECONDS + 5  # the node was down for hours
    # every 10 s: the slot just due (at most GRACE_SECONDS ago) is on time even after a gap
    assert plan_firing(row("every", "10.0", 100.0), late) == Firing(late - 5, late + 5)
    hourly = row("every", "3600.0", 100.0)
    assert plan_firing(hourly, late) == Firing(None, 100.0 + 11 * 3600)  # skipped
    catch_up = row("every", "3600.0", 100.0, missed="catch-up")
    assert plan_firing(catch_up, late) == Firing(100.0 + 10 * 3600, 100.0 + 11 * 3600)
    assert plan_firing(row("once", "100.0", 100.0), late) == Firing(None, None)
    assert plan_firing(row("once", "100.0", 100.0, "catch-up"), late) == Firing(100.0, None)


def test_cron_slots_follow_the_expression_in_utc() -> None:
    noon = datetime.datetime(2026, 11, 24, 12, 0, tzinfo=datetime.UTC).timestamp()
    assert slot_after("cron", "*/15 * * * *", noon, noon) == noon + 900
    assert (
        slot_after("cron", "0 9 * * 1", noon, noon)
        == datetime.datetime(2026, 11, 30, 9, 0, tzinfo=datetime.UTC).timestamp()
    )  # the next Monday, 09:00 UTC
    assert plan_firing(row("cron", "*/15 * * * *", noon), noon + 930) == Firing(
        noon + 900, noon + 1800
    )


class NotStartable(FlowLogic[None]):
    def call(self) -> None:
        return None


@pytest.fixture
def client(net: MockNetwork) -> Iterator[NodeClient]:
    alice = net.create_node(ALICE)
    config = alice.node.config
    made = NodeClient(config.database_url, database_schema=config.database_schema)
    yield made
    made.close()


def fire_and_run(net: MockNetwork, node: MockNode) -> int:
    fired = node.node.fire_schedules()
    node.node.start_requested_flows()
    net.run_network(advance_clock=False)
    return fired


def pongs(node: MockNode) -> int:
    return node.node.database.count("node_flow_results")


def test_an_interval_schedule_fires_once_per_slot(net: MockNetwork, client: NodeClient) -> None:
    alice, bob = net.nodes[0], net.create_node(BOB)
    start = net.clock.now() + 30
    schedule_id = client.schedule_flow(
        PingFlow(bob.party), every=60, start=start, schedule_id="ping-every-minute"
    )
    assert fire_and_run(net, alice) == 0  # not due yet
    for slot in range(3):
        net.clock.advance_to(start + 60 * slot + 1)
        assert fire_and_run(net, alice) == 1
        assert fire_and_run(net, alice) == 0  # a second look fires nothing
    flow_ids = [slot_request_id(schedule_id, start + 60 * slot) for slot in range(3)]
    assert [alice.flow_result(flow_id) for flow_id in flow_ids] == ["Pong"] * 3
    (shown,) = client.schedules()
    assert (shown.fired, shown.last_slot, shown.next_slot) == (3, start + 120, start + 180)


def test_a_slot_fires_once_across_a_restart_between_firing_and_starting(
    net: MockNetwork, client: NodeClient
) -> None:
    alice, bob = net.nodes[0], net.create_node(BOB)
    at = net.clock.now() + 5
    schedule_id = client.schedule_flow(PingFlow(bob.party), at=at, schedule_id="once")
    net.clock.advance_to(at)
    stale = client.schedules()[0]
    assert alice.node.fire_schedules() == 1  # the request is committed with the schedule
    alice.restart()  # before the request was started
    assert alice.node.fire_schedules() == 0
    # a node that read the schedule before the firing committed cannot fire it again
    assert alice.node.database.schedules.fire(stale, None, None, None, at) is False
    alice.node.start_requested_flows()
    net.run_network(advance_clock=False)
    assert alice.flow_result(slot_request_id(schedule_id, at)) == "Pong"
    assert pongs(alice) == 1
    assert client.schedules()[0].next_slot is None  # a one-off schedule is done


def test_a_node_that_was_down_catches_up_once(net: MockNetwork, client: NodeClient) -> None:
    alice, bob = net.nodes[0], net.create_node(BOB)
    start = net.clock.now() + 10
    client.schedule_flow(PingFlow(bob.party), every=600, start=start, missed="catch-up")
    client.schedule_flow(PingFlow(bob.party), every=600, start=start, schedule_id="skipping")
    net.clock.advance_to(start + 5 * 600 + 2 * GRACE_SECONDS)  # five slots missed
    alice.restart()
    assert fire_and_run(net, alice) == 1  # one for the missed slots; none for "skipping"
    assert pongs(alice) == 1
    assert {s.next_slot for s in client.schedules()} == {start + 6 * 600}


def test_schedules_are_listed_paused_resumed_and_removed(
    net: MockNetwork, client: NodeClient
) -> None:
    alice, bob = net.nodes[0], net.create_node(BOB)
    start = net.clock.now() + 10
    client.schedule_flow(PingFlow(bob.party), every=60, start=start, schedule_id="a")
    client.schedule_flow(PingFlow(bob.party), cron="0 * * * *", start=start + 7200, schedule_id="b")
    assert [s.schedule_id for s in client.schedules()] == ["a", "b"]
    client.pause_schedule("a")
    net.clock.advance_to(start + 1)
    assert fire_and_run(net, alice) == 0
    client.resume_schedule("a")
    assert fire_and_run(net, alice) == 1
    client.remove_schedule("a")
    assert [s.schedule_id for s in client.schedules()] == ["b"]
    with pytest.raises(KeyError, match="no schedule named 'a'"):
        client.pause_schedule("a")
    with pytest.raises(ScheduleExistsError, match="'b' exists already"):
        client.schedule_flow(PingFlow(bob.party), every=5, schedule_id="b")
    assert alice.node.database.count(schema.node_schedules.name) == 1


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ({}, "exactly one of at=, every= and cron="),
        ({"every": 5, "cron": "* * * * *"}, "exactly one of"),
        ({"every": 0}, "every must be a positive number of seconds"),
        ({"cron": "every day"}, "is not a cron expression of five fields"),
        ({"at": datetime.datetime(2030, 1, 1)}, "at must be an aware datetime"),
        ({"every": 5, "schedule_id": "no spaces"}, "schedule id 'no spaces'"),
        ({"every": 5, "missed": "later"}, "missed must be one of skip, catch-up"),
    ],
)
def test_a_schedule_that_cannot_be_made_says_why(
    client: NodeClient, when: dict[str, object], problem: str
) -> None:
    with pytest.raises(ScheduleError, match=problem):
        client.schedule_flow(PingFlow(Party(BOB)), **when)  # type: ignore[arg-type]


def test_only_flows_startable_by_rpc_can_be_scheduled(client: NodeClient) -> None:
    with pytest.raises(ScheduleError, match="not marked @startable_by_rpc"):
        client.schedule_flow(NotStartable(), every=60)


def test_the_schedule_command_adds_lists_pauses_and_removes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "alice.toml"
    config.write_text(
        f'name = "{ALICE}"\ndatabase_url = "sqlite:///alice.db"\n'
        'transport_url = "sqlite:///queue.db"\n'
    )
    NodeDatabase(f"sqlite:///{tmp_path / 'alice.db'}").close()  # as the node makes it
    add = ["schedule", "add", "--config", str(config), "--flow", "samples.pingpong.PingFlow"]
    bob = json.dumps([{"party": BOB}])
    assert main([*add, "--args", bob, "--every", "60", "--id", "ping-bob"]) == 0
    assert "schedule ping-bob: PingFlow every 60 s, next " in capsys.readouterr().out
    assert main([*add, "--args", bob, "--cron", "0 6 * * *", "--missed", "catch-up"]) == 0
    assert main(["schedule", "pause", "ping-bob", "--config", str(config)]) == 0
    capsys.readouterr()
    assert main(["schedule", "list", "--config", str(config)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split() == ["SCHEDULE", "FLOW", "WHEN", "NEXT", "STATE", "FIRED", "MISSED"]
    assert "paused" in listed[2] and listed[2].startswith("ping-bob")
    assert "cron '0 6 * * *' (UTC)" in listed[1] and "catch-up" in listed[1]
    assert main(["schedule", "remove", "ping-bob", "--config", str(config)]) == 0
    assert main(["schedule", "remove", "ping-bob", "--config", str(config)]) == 2
    assert "no schedule named 'ping-bob'" in capsys.readouterr().err
    assert main([*add, "--every", "60"]) == 2  # PingFlow needs its recipient
    assert "PingFlow cannot be made with those arguments" in capsys.readouterr().err
    assert main([*add, "--args", bob, "--at", "2030-01-01T06:00:00"]) == 2
    assert "needs a timezone" in capsys.readouterr().err


def test_a_cron_expression_longer_than_its_column_is_refused(client: NodeClient) -> None:
    with pytest.raises(ScheduleError, match="at most 200 characters"):
        client.schedule_flow(PingFlow(Party(BOB)), cron="0 " + "1," * 120 + "1 * * *")
