"""One flow with many sessions costs the same per session whatever their number.

No timing: each test counts work done by the pure transition function while one flow opens
n sessions, sends on each, waits for all of them with one receive and takes in every
peer's confirm and reply; then the same for 4n sessions. Work per session must not grow with
n (a quadratic bookkeeping grows it 4-fold, a cubic one 16-fold). Counted:

* Python lines executed (lookups that scan the sessions, receives that look at every
  session per message, indexes rebuilt per step);
* bytes of objects built per step that the previous state did not already hold (tuples of
  every session or journal entry copied to change one of them);
* checkpoint bytes encoded by the commits of a flow that grows without blocking (a commit
  every 32 steps of a checkpoint that keeps growing).
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

from persistence.checkpoint_codec import encode_checkpoint
from statemachine import transition
from statemachine.actions import PersistCheckpoint
from statemachine.events import DeliverSessionMessage, Event, StartFlow, Suspend
from statemachine.iorequests import InitiateSession, Receive, Send, SessionPayload
from statemachine.result import TransitionResult
from statemachine.session_ids import (
    initiator_session_id,
    message_id,
    responder_session_id,
)
from statemachine.session_messages import (
    ConfirmSession,
    SessionData,
)
from statemachine.state import FlowState, FlowStatus, StartedLocally

BOB = "O=Bob,L=New York,C=US"
ORIGIN = StartedLocally("app.FanOutFlow", b"\x92\x90\x80")
T0 = 1000.0
GROWTH_ALLOWED = 1.5
"""Per-session work at 4n over work at n: linear is about 1, quadratic about 4."""
MEMORY_GROWTH_ALLOWED = 2.0
"""The same for memory built per step. Changing one of n items of a persistent vector or map
copies one path of 32-slot nodes, which at 4n may be one node longer and have wider nodes
near the root: about 1.4 here (copying a tuple of all sessions or entries gives 3.5)."""


def fan_out(count: int, *, deliver: bool = True) -> Iterator[tuple[str, Event]]:
    """The events of one flow talking to ``count`` peers, each with its phase's name."""
    yield "start", StartFlow("f1", ORIGIN, T0, "A")
    for _ in range(count):
        yield "open", Suspend(InitiateSession(BOB, "app.FanOutFlow", 1, "app"), T0)
    session_ids = [initiator_session_id("f1", index, "A") for index in range(count)]
    for session_id in session_ids:
        yield "send", Suspend(Send((SessionPayload(session_id, b"\x01"),)), T0)
    yield "receive", Suspend(Receive(tuple(session_ids)), T0)
    if not deliver:
        return
    for sequence, body in ((0, ConfirmSession(1, "app")), (1, SessionData(b"\x02"))):
        for session_id in session_ids:
            peer = responder_session_id(session_id)
            yield (
                "deliver",
                DeliverSessionMessage(
                    session_id, message_id(peer, sequence), BOB, sequence, body, T0
                ),
            )


def run(
    count: int, step: Callable[[str, FlowState | None, Event], TransitionResult], **kw: Any
) -> FlowState:
    state: FlowState | None = None
    for phase, event in fan_out(count, **kw):
        state = step(phase, state, event).state
    assert state is not None
    return state


def test_the_fan_out_runs_to_completion() -> None:
    state = run(50, lambda _, s, e: transition(s, e))
    assert state.status is FlowStatus.RUNNABLE  # resumed with every reply
    assert state.checkpoint.journal[-1].outcome.value == (b"\x02",) * 50  # type: ignore[union-attr]


# --- Python lines executed ------------------------------------------------------------


class LineCounter:
    """Counts Python lines executed while installed; gives up past ``budget`` lines."""

    def __init__(self, budget: int) -> None:
        self.lines = 0
        self.budget = budget

    def __enter__(self) -> LineCounter:
        sys.settrace(self._global)
        return self

    def __exit__(self, *_: object) -> None:
        sys.settrace(None)

    def _global(self, frame: types.FrameType, event: str, arg: object) -> Any:
        return self._local if self.lines <= self.budget else None

    def _local(self, frame: types.FrameType, event: str, arg: object) -> Any:
        if event == "line":
            self.lines += 1
            if self.lines > self.budget:  # far over: stop counting (and slowing) here
                sys.settrace(None)
                return None
        return self._local


def lines_per_session(count: int, budget: int) -> float:
    with LineCounter(budget * count) as counter:
        run(count, lambda _, s, e: transition(s, e))
    return counter.lines / count


def test_lines_executed_per_session_do_not_grow_with_the_number_of_sessions() -> None:
    small = lines_per_session(100, budget=10**9)
    large = lines_per_session(400, budget=int(small * GROWTH_ALLOWED * 2))
    assert large <= small * GROWTH_ALLOWED, (
        f"{large:.0f} lines per session with 400 sessions, {small:.0f} with 100"
    )


# --- memory built per step ------------------------------------------------------------


def _reachable(root: object, known: dict[int, object] | None = None) -> dict[int, object]:
    """Objects reachable from ``root`` (not through classes, modules or ``known``)."""
    seen: dict[int, object] = {}
    stack = [root]
    while stack:
        item = stack.pop()
        key = id(item)
        if key in seen or (known is not None and key in known):
            continue
        if isinstance(item, type | types.ModuleType | types.FunctionType):
            continue
        seen[key] = item
        stack.extend(gc.get_referents(item))
    return seen


def new_bytes_per_step(count: int) -> dict[str, float]:
    """Mean bytes a step builds anew, per phase, over steps late in each phase."""
    sampled = {"open": range(count - 10, count), "send": range(count - 10, count)}
    sampled["deliver"] = range(count + count // 2, count + count // 2 + 10)
    seen: dict[str, int] = {}
    built: dict[str, list[int]] = {phase: [] for phase in sampled}

    def step(phase: str, state: FlowState | None, event: Event) -> TransitionResult:
        index = seen[phase] = seen.get(phase, -1) + 1
        result = transition(state, event)
        if phase in sampled and index in sampled[phase]:
            before = _reachable(state)
            fresh = _reachable(result.state, before)
            built[phase].append(sum(sys.getsizeof(item) for item in fresh.values()))
        return result

    run(count, step)
    return {phase: sum(sizes) / len(sizes) for phase, sizes in built.items()}


def test_memory_built_per_step_does_not_grow_with_the_number_of_sessions() -> None:
    small, large = new_bytes_per_step(200), new_bytes_per_step(800)
    for phase in small:
        assert large[phase] <= small[phase] * MEMORY_GROWTH_ALLOWED, (
            f"a {phase} step builds {large[phase]:.0f} bytes with 800 sessions, "
            f"{small[phase]:.0f} with 200"
        )


# --- checkpoint bytes encoded -----------------------------------------------------------


def encoded_bytes_per_session(count: int) -> float:
    encoded = 0

    def step(_: str, state: FlowState | None, event: Event) -> TransitionResult:
        nonlocal encoded
        result = transition(state, event)
        for action in result.actions:
            if isinstance(action, PersistCheckpoint):
                encoded += len(encode_checkpoint(action.checkpoint))
        return result

    run(count, step, deliver=False)
    return encoded / count


def test_checkpoint_bytes_encoded_per_session_do_not_grow_with_the_number_of_sessions() -> None:
    small, large = encoded_bytes_per_session(250), encoded_bytes_per_session(1000)
    assert large <= small * GROWTH_ALLOWED, (
        f"{large:.0f} checkpoint bytes encoded per session with 1000 sessions, {small:.0f} with 250"
    )
