"""Flows for the RPC tests: progress steps held at gates the test opens, typed arguments."""

from __future__ import annotations

import functools
import threading
from typing import Any

from sqlalchemy.exc import OperationalError

from flows import FlowLogic, Party, startable_by_rpc
from flows.node.external_operations import OperationContext

GATES: dict[str, threading.Event] = {}
"""Gates by name; a StepsFlow waits at each of its steps until the test opens it."""


def gate(name: str) -> threading.Event:
    return GATES.setdefault(name, threading.Event())


def _wait_at_gate(context: OperationContext, name: str) -> str:
    gate(name).wait(60)
    return name


@startable_by_rpc
class StepsFlow(FlowLogic[list[str]]):
    """Reports each step as its progress and waits at the gate of that name."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    def call(self) -> list[str]:
        passed = []
        for step in self.steps:
            self.progress(step)
            passed.append(self.call_external(functools.partial(_wait_at_gate, name=step)))
        return passed


@startable_by_rpc
class TypedFlow(FlowLogic[dict[str, object]]):
    """Takes one argument of each kind the API converts; returns them."""

    def __init__(
        self,
        party: Party,
        count: int,
        ratio: float,
        flag: bool,
        names: list[str],
        extra: dict[str, int] | None = None,
    ) -> None:
        if count < 0:
            raise ValueError("count must not be negative")
        self.party = party
        self.count = count
        self.ratio = ratio
        self.flag = flag
        self.names = names
        self.extra = extra

    def call(self) -> dict[str, object]:
        return {"party": self.party, "count": self.count, "names": self.names}


BROKEN: set[str] = set()
"""Keys of HospitalFlow effects that fail (a locked database) until the test heals them."""


def _effect(key: str, _: Any) -> None:
    if key in BROKEN:
        raise OperationalError(f"effect {key}", {}, Exception("database is locked"))


@startable_by_rpc
class HospitalFlow(FlowLogic[str]):
    """An effect that fails while ``key`` is in BROKEN: after three failures in a row the
    node keeps the flow in the hospital; once healed, a retry completes it."""

    def __init__(self, key: str) -> None:
        self.key = key

    def call(self) -> str:
        self.in_transaction(functools.partial(_effect, self.key), "effect")
        self.sleep(0.01)  # a checkpoint: the effect commits in its own step
        return f"healed {self.key}"


@startable_by_rpc
class FailingFlow(FlowLogic[str]):
    """Fails in its own code with ``message`` (a bug: the node keeps its traceback)."""

    def __init__(self, message: str) -> None:
        self.message = message

    def call(self) -> str:
        raise ValueError(self.message)


class UnmarkedFlow(FlowLogic[str]):
    """Not startable by RPC."""

    def call(self) -> str:
        return "no"


def _price_of(item: str) -> int:
    prices: dict[str, int] = {}
    return prices[item]  # a KeyError: a bug in a helper of flow code


@startable_by_rpc
class BrokenFlow(FlowLogic[int]):
    """Fails with a KeyError in a helper (a bug, not a FlowException): its traceback is kept."""

    def __init__(self, item: str) -> None:
        self.item = item

    def call(self) -> int:
        return _price_of(self.item)
