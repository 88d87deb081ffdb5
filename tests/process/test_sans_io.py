"""The state machine imports no I/O: checked in a fresh interpreter.

attrs (a dependency the core may use, like pyrsistent) loads ``threading`` itself, so the
probe imports attrs first and only counts what importing the state machine adds on top
(pyrsistent included: it loads no I/O, threading or logging).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IO_PACKAGES = {
    "sqlalchemy",
    "greenlet",
    "socket",
    "messaging",
    "persistence",
    "flows",
    "msgpack",
    "asyncio",
    "pika",
    "sqlite3",
    "select",
    "selectors",
    "ssl",
}

PROBE = """
import json, sys
import attrs
before = set(sys.modules)
for name in sys.argv[1:]:
    __import__(name)
print(json.dumps(sorted(set(sys.modules) - before)))
"""

PURE_CORE = [
    "statemachine.transition",
    "statemachine.state",
    "statemachine.events",
    "statemachine.actions",
    "statemachine.result",
    "statemachine.session_ops",
]
DRIVERS = ["statemachine.executor", "statemachine.manager", "statemachine.ports"]


def _loaded_by(modules: list[str]) -> list[str]:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    loaded: list[str] = json.loads(completed.stdout)
    assert modules[0] in loaded  # the probe really imported it
    return loaded


def test_transition_code_loads_no_io_threading_or_logging() -> None:
    loaded = _loaded_by(PURE_CORE)
    forbidden = IO_PACKAGES | {"threading", "logging"}
    assert [m for m in loaded if m.split(".")[0] in forbidden] == []


@pytest.mark.parametrize("module", DRIVERS)
def test_executor_and_manager_reach_io_only_through_ports(module: str) -> None:
    loaded = _loaded_by([module])
    assert [m for m in loaded if m.split(".")[0] in IO_PACKAGES] == []
