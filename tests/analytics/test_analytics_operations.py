"""The stuck-flow check and flows waiting on external operations (``FlowLogic.call_external``).

A flow whose operation has not come back (its call blocks) and one backing off before a
retry are suspended on ``Operation``; analyzed hours later, both are stuck (the running one
since its checkpoint, the backing-off one since its retry time), and neither is stuck
minutes later. Real flows on a MockNetwork node; its database is copied and analyzed.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from flows import FlowLogic
from flows.node.external_operations import OperationContext
from flows.testing import MockNetwork
from persistence.analytics import CheckSettings, analyze, parse_node_argument
from statemachine.iorequests import RetryPolicy
from tests.analytics.test_analytics import require_jdbc
from tests.analytics_data import ALICE, CORDAPPS

RELEASE = threading.Event()
HOUR_MS = 3_600_000


def hangs(context: OperationContext) -> str:
    RELEASE.wait(60)
    return "released"


def fails(context: OperationContext) -> str:
    raise ConnectionError("the service is down")


class HangingFlow(FlowLogic[str]):
    def call(self) -> str:
        result: str = self.call_external(hangs)
        return result


class BackingOffFlow(FlowLogic[str]):
    def call(self) -> str:
        result: str = self.call_external(
            fails, retry=RetryPolicy(attempts=5, backoff=3600, max_backoff=3600, jitter=0)
        )
        return result


def _operation_rows(path: Path) -> dict[str, dict[str, Any]]:
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute(
            "SELECT flow_id, waiting_for, updated_at FROM node_checkpoints "
            "WHERE suspended_on = 'Operation'"
        ).fetchall()
    finally:
        connection.close()
    return {flow_id: {**json.loads(waits), "updated_at": at} for flow_id, waits, at in rows}


@pytest.mark.spark
def test_flows_waiting_on_operations_are_stuck_hours_later_and_not_minutes_later(
    spark: Any, tmp_path: Path
) -> None:
    require_jdbc()
    RELEASE.clear()
    network = MockNetwork(cordapps=CORDAPPS, directory=tmp_path / "run")
    try:
        alice = network.create_node(ALICE)
        hanging = alice.start_flow(HangingFlow())
        backing_off = alice.start_flow(BackingOffFlow())
        network.run_network(operation_wait=0, advance_clock=False)
        live = Path(alice.config.database_url.removeprefix("sqlite:///"))
        copy = tmp_path / "alice.db"
        source, target = sqlite3.connect(live), sqlite3.connect(copy)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        now_ms = round(network.clock.now() * 1000)
    finally:
        RELEASE.set()
        network.stop_nodes()
    waits = _operation_rows(copy)
    assert waits[hanging.flow_id]["state"] == "running"
    assert waits[backing_off.flow_id]["state"] == "backing off"
    retry_at = waits[backing_off.flow_id]["until"]
    assert retry_at is not None and retry_at > now_ms  # an hour's backoff
    sources = [parse_node_argument(f"{ALICE}=sqlite:///{copy}")]

    later = analyze(sources, CheckSettings(as_of_ms=now_ms + 3 * HOUR_MS), spark=spark)
    stuck = later.check("stuck_flows")
    found = {
        row[stuck.table.columns.index("flow_id")]: dict(zip(stuck.table.columns, row, strict=True))
        for row in stuck.table.rows
    }
    assert set(found) == {hanging.flow_id, backing_off.flow_id}
    assert {row["suspended_on"] for row in found.values()} == {"Operation"}
    running_since = waits[hanging.flow_id]["updated_at"]
    assert found[hanging.flow_id]["waited_ms"] == now_ms + 3 * HOUR_MS - running_since
    assert found[backing_off.flow_id]["waited_ms"] == now_ms + 3 * HOUR_MS - retry_at
    assert stuck.status == "warn"

    soon = analyze(sources, CheckSettings(as_of_ms=now_ms + 5 * 60_000), spark=spark)
    assert soon.check("stuck_flows").table.rows == []
    assert soon.check("stuck_flows").status == "ok"
