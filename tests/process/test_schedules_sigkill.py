"""A schedule fired by a real node process, killed with SIGKILL while it fires: once per slot.

Alice and Bob run as ``fiberflow node run`` processes on one SQL queue. A schedule pings Bob
every half second; Alice is killed with SIGKILL and restarted while it fires, then the
schedule is paused. Every flow the schedule started has the id of one slot on its grid, no
slot started two, each finished once, and the schedule counted exactly those it started.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from flows.node.schedules import slot_request_id
from flows.party import Party
from persistence import schema
from samples.pingpong import PingFlow
from tests.process_cluster import NAMES, ClusterNode
from tests.waiting import wait_until

INTERVAL = 0.5


@pytest.mark.slow
def test_a_schedule_starts_one_flow_per_slot_across_sigkills(tmp_path: Path) -> None:
    queue = f"sqlite:///{tmp_path / 'queue.db'}"
    alice, bob = (ClusterNode(name, tmp_path, None, queue) for name in NAMES[:2])
    try:
        for node in (alice, bob):
            node.start()
            node.wait_started()
        first = time.time() + INTERVAL
        alice.client.schedule_flow(
            PingFlow(Party(bob.name)), every=INTERVAL, start=first, schedule_id="ping-bob"
        )
        for _ in range(2):
            time.sleep(2.5)
            alice.kill()
            time.sleep(0.3)
            alice.start()
            alice.wait_started()
        time.sleep(2.5)
        alice.client.pause_schedule("ping-bob")
        time.sleep(0.5)  # a firing that read the schedule before the pause completes
        table = schema.node_flow_requests
        with alice.client.database.engine.connect() as connection:
            requested = list(connection.execute(select(table.c.request_id)).scalars())
        outcomes = alice.client.wait(requested, timeout=120)
        (schedule,) = alice.client.schedules()
        wait_until(
            lambda: bob.counts(schema.node_flow_results)["PongFlow"] == len(requested),
            "every PongFlow to finish",
            60,
        )
    finally:
        alice.stop()
        bob.stop()
        alice.client.close()
        bob.client.close()
    grid = {slot_request_id("ping-bob", first + k * INTERVAL): k for k in range(200)}
    assert requested and all(request_id in grid for request_id in requested)
    assert len(set(requested)) == len(requested) == schedule.fired
    assert all(outcome.result is not None for outcome in outcomes.values())
    slots = sorted(grid[request_id] for request_id in requested)
    print(f"{len(requested)} slots fired across 2 SIGKILLs: {slots}")
