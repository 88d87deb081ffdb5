"""Writing a flow is light: importing the flow API loads no database, transport or crypto.

Checked in a fresh interpreter (``subprocess``), since this test process has loaded everything
already. ``Node`` and the other names that need the node's machinery load on first use.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["cryptography", "greenlet", "pika", "psycopg", "sqlalchemy"]
"""Libraries a flow module must not drag in by importing the flow API."""

FLOW_API = "from flows import FlowLogic, FlowSession, initiating_flow, initiated_by, Party"


def _loaded_after(statement: str) -> set[str]:
    """The top-level packages in ``sys.modules`` of a fresh interpreter after ``statement``."""
    probe = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    completed = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return {name.split(".")[0] for name in json.loads(completed.stdout)}


def test_the_flow_api_loads_no_database_transport_or_cryptography() -> None:
    loaded = _loaded_after(FLOW_API)
    assert "flows" in loaded
    assert sorted(loaded & set(HEAVY)) == []


def test_every_public_name_is_light_but_the_node_s() -> None:
    light = ", ".join(
        name
        for name in [
            "FOREVER",
            "FlowException",
            "FlowNonDeterminismError",
            "UnexpectedFlowEndException",
            "UntrustworthyData",
            "serializable",
            "startable_by_rpc",
        ]
    )
    assert sorted(_loaded_after(f"{FLOW_API}\nfrom flows import {light}") & set(HEAVY)) == []


def test_the_node_s_names_still_load_on_first_use() -> None:
    loaded = _loaded_after("import flows\nassert flows.Node.__name__ == 'Node'")
    assert "sqlalchemy" in loaded


def test_a_node_process_without_metrics_never_loads_the_prometheus_client() -> None:
    loaded = _loaded_after(
        "import flows.process.process, flows.testing, flows.cli.main\n"
        "assert flows.process.process.NodeProcess"
    )
    assert "sqlalchemy" in loaded  # (the node's machinery is loaded)
    assert "prometheus_client" not in loaded
    assert "prometheus_client" in _loaded_after("import flows.metrics")
