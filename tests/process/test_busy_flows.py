"""No flow starves the node unseen, and SIGTERM works whatever flows do.

A node process runs a flow that computes (or blocks in a system call) for ten minutes
without suspending. The node logs it with its id, class and line once it has run longer than
``busy_warning_seconds``; ``fiberflow flow list`` shows it as RUNNING with the line; SIGTERM
stops the process within its grace period (the flow is interrupted, nothing is committed, and
it resumes from its last checkpoint at the next start). On SQLite + the SQL queue and on
PostgreSQL + RabbitMQ.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.config.runtime import load_config
from flows.node.inspection import list_flows
from foundation.engine import drop_schema
from messaging.transports import purge_queues
from tests.cordapp import BusyFlow
from tests.process.test_single_writer import backends, log_of
from tests.process_cluster import NAMES, ClusterNode
from tests.waiting import wait_until

ALICE = NAMES[0]


@pytest.mark.parametrize("how", ["compute", "block", "effect"])
@pytest.mark.parametrize("which", ["sqlite", "postgresql"])
def test_a_flow_that_never_suspends_is_logged_listed_and_sigterm_still_stops_the_node(
    tmp_path: Path, which: str, how: str
) -> None:
    transport, database = backends(tmp_path, which)
    alice = ClusterNode(ALICE, tmp_path, database, transport, {"busy_warning_seconds": 1})
    try:
        alice.start()
        alice.wait_started()
        (flow_id,) = alice.client.start_flows([BusyFlow(600, how)])
        wait_until(
            lambda: "without suspending, at cordapp.py:" in log_of(alice.log_path),
            "the watchdog to name the busy flow",
        )
        (line,) = [x for x in log_of(alice.log_path).splitlines() if "without suspending" in x]
        assert f"flow {flow_id} (tests.cordapp.BusyFlow) has been running" in line
        function = "<lambda>" if how == "effect" else "call"  # the effect, or call() itself
        assert f"in {function}" in line and "every other flow of this node waits" in line
        config = load_config(alice.config_path)
        listed: Callable[[], list[dict[str, object]]] = lambda: [  # noqa: E731
            f for f in list_flows(config) if f["flow_id"] == flow_id
        ]
        if (which, how) != ("sqlite", "effect"):
            # (On SQLite an effect runs inside the step's transaction, which holds the write
            # lock: nothing can be written until it ends, the note included; the log has it.)
            wait_until(
                lambda: [f["status"] for f in listed()] == ["RUNNING"], "flow list to show it"
            )
            (shown,) = listed()
            assert str(shown["waiting_on"]).startswith("running ")
            assert "at cordapp.py:" in str(shown["waiting_on"])
        assert alice.process is not None
        asked = time.monotonic()
        alice.process.send_signal(signal.SIGTERM)
        assert alice.process.wait(60) == 0, log_of(alice.log_path)[-3000:]
        print(f"stopped {time.monotonic() - asked:.1f} s after SIGTERM")
        text = log_of(alice.log_path)
        assert f"flow {flow_id} (tests.cordapp.BusyFlow) still running" in text
        assert "interrupted it to stop; it resumes from its last checkpoint" in text
        assert "Traceback" not in text
        # Nothing of it was committed: its checkpoint is still there, no outcome.
        assert alice.client.outcomes([flow_id]) == {}
        assert [f["flow_id"] for f in list_flows(config)] == [flow_id]
    finally:
        alice.stop()
        alice.client.close()
        if alice.schema is not None and database is not None:
            drop_schema(database, alice.schema)
        purge_queues(transport, [ALICE])
