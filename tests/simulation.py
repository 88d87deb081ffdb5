"""Deterministic simulation: a whole network in one process under a seeded schedule.

A :class:`Schedule` says which flows start (pings, payments with ledger side effects, trades
with a third-party approver, quote collections with ``receive_all``, durable sleeps), on
which nodes, and what happens between the starts: which node runs a round, when the whole
network runs one, which message is delivered next, duplicated or delayed (message by
message: picking another than the first reorders), where a node crashes (an armed crash
point, or a plain restart), when the clock moves and when delayed messages are released
(see ``STEP_KINDS``). On top of that the network can inject seeded faults (drops before
hand-off, duplicates, delays, reordering) at the rates the schedule sets.

:func:`run_schedule` plays a schedule on a fresh :class:`~flows.testing.MockNetwork` of three
SQLite nodes, lets the network drain, and checks the invariants:

* every started flow finished with the result a fault-free run gives (or its documented
  error: a trade above the approval limit is refused);
* exactly once: each node holds exactly one result (or error) per flow it should have run
  (one ``PongFlow`` per ping, one ``SellerFlow`` per trade, ...), and each ledger row written
  by ``in_transaction`` appears once; message ids are a primary key, so none was consumed
  twice;
* nothing left: no checkpoint, no outbox row, no message queued or unacknowledged.

``tests/unit/test_simulation.py`` explores schedules with hypothesis; ``python -m tests.campaign``
runs a long campaign from seeds. Every failure names the command that replays it.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
from hypothesis import strategies as st
from sqlalchemy import select

from flows.node.handles import FlowHandle
from flows.testing import MockNetwork, MockNode, SimulatedCrash
from messaging.inmemory import Faults
from persistence import schema
from samples.pingpong import PingFlow
from samples.trade import BuyerFlow, TradeOutcome
from samples.trade.flows import APPROVAL_LIMIT_CENTS
from tests.conftest import CORDAPPS
from tests.cordapp import (
    LEDGER_METADATA,
    CollectQuotesFlow,
    PaymentFlow,
    Quote,
    SleepyFlow,
    ledger_entries,
)
from tests.helpers import assert_drained

NAMES = ("O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US", "O=Carol,L=Zurich,C=CH")
KINDS = ("ping", "payment", "trade", "quotes", "sleep")
CRASH_POINTS = (
    "before_transaction",
    "after_PersistCheckpoint",
    "after_RemoveCheckpoint",
    "after_RecordInboundMessages",
    "after_WriteOutbox",
    "after_RunFlowEffects",
    "after_StoreFlowResult",
    "after_StoreFlowError",
    "after_commit",
    "after_AcknowledgeMessages",
    "after_HandOffMessages",
    "after_hand_off",
    "after_outbox_delete",
    "flow_suspended",
    "during_replay",
)
STEP_KINDS = (
    "node",
    "network",
    "restart",
    "arm",
    "advance",
    "release",
    "deliver",
    "duplicate",
    "delay",
    "hibernate",
    "wake",
)
"""What a step does: ``node`` delivers everything queued for a node and runs a round on it;
``network`` does that on every node; ``deliver`` hands one chosen message (``arg`` picks
which of those ready: any but the first reorders) to a node and runs a round on it;
``duplicate`` queues a second copy of a chosen message; ``delay`` holds a chosen message back
for a few steps; ``restart`` crashes a node and restarts it; ``arm`` arms a crash point
(``arg``: point and occurrence); ``advance`` moves the clock; ``release`` frees every
delayed message; ``hibernate`` drops the memory of every waiting flow of a node (committing
what they took in first); ``wake`` restores every dormant flow of a node."""


@attrs.frozen
class FlowSpec:
    """One flow to start: its kind, the node that starts it, the others involved, a number."""

    kind: str
    node: int
    others: tuple[int, ...]
    amount: int


@attrs.frozen
class Step:
    """One scheduled event (see the module docstring); ``start`` steps name a flow index."""

    kind: str
    node: int = 0
    arg: int = 0


@attrs.frozen
class Schedule:
    """Everything that decides a simulated run."""

    seed: int
    drop: float
    duplicate: float
    delay: float
    reorder: float
    flows: tuple[FlowSpec, ...]
    steps: tuple[Step, ...]
    hibernate: bool = False
    """Every waiting flow hibernates as soon as its round commits (``hibernate_after=0``)."""

    def to_json(self) -> str:
        """A compact JSON form (what ``python -m tests.campaign --replay`` takes)."""
        return json.dumps(attrs.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        """The schedule written by :meth:`to_json`."""
        document = json.loads(text)
        document["flows"] = tuple(
            FlowSpec(f["kind"], f["node"], tuple(f["others"]), f["amount"])
            for f in document["flows"]
        )
        document["steps"] = tuple(Step(**s) for s in document["steps"])
        return cls(**document)

    def describe(self) -> str:
        """A short summary for campaign output."""
        kinds = Counter(f.kind for f in self.flows)
        crashes = sum(1 for s in self.steps if s.kind in ("arm", "restart"))
        return (
            f"{len(self.flows)} flows {dict(kinds)}, {len(self.steps)} steps, "
            f"{crashes} crashes armed or forced, faults d={self.drop} dup={self.duplicate} "
            f"delay={self.delay} reorder={self.reorder}"
            + (", every waiting flow hibernated" if self.hibernate else "")
        )


class InvariantViolation(AssertionError):
    """A simulated run broke an invariant; the message says how to replay it."""


# --- generating schedules ------------------------------------------------------------------


def _flow_spec(kind: str, node: int, rng_others: list[int], amount: int) -> FlowSpec:
    if kind in ("ping", "payment"):
        return FlowSpec(kind, node, (rng_others[0],), amount)
    if kind == "trade":
        return FlowSpec(kind, node, (rng_others[0], rng_others[1]), amount)
    if kind == "quotes":
        return FlowSpec(kind, node, tuple(rng_others), amount)
    return FlowSpec(kind, node, (), amount)


def schedule_from_seed(seed: int) -> Schedule:
    """A random schedule, fully decided by ``seed`` (the campaign's generator)."""
    rng = random.Random(seed)
    flows = []
    for _ in range(rng.randint(1, 8)):
        kind = rng.choice(KINDS)
        node = rng.randrange(3)
        others = [n for n in range(3) if n != node]
        rng.shuffle(others)
        amount = rng.choice((1, 50, 4_000, 2_000_000))
        flows.append(_flow_spec(kind, node, others, amount))
    steps = [Step("start", arg=i) for i in range(len(flows))]
    for _ in range(rng.randint(0, 60)):
        kind = rng.choice(STEP_KINDS)
        steps.append(_step(kind, rng.randrange(3), rng.randrange(len(CRASH_POINTS)), rng))
    starts = steps[: len(flows)]
    rest = steps[len(flows) :]
    rng.shuffle(rest)
    merged: list[Step] = []
    for step in rest:  # keep the starts in order, spread among the rest
        if starts and rng.random() < 0.3:
            merged.append(starts.pop(0))
        merged.append(step)
    merged.extend(starts)
    level = rng.choice((0.0, 0.1, 0.3))
    return Schedule(
        seed=seed,
        drop=level and rng.choice((0.0, level)),
        duplicate=level and rng.choice((0.0, level)),
        delay=level and rng.choice((0.0, level)),
        reorder=level and rng.choice((0.0, level)),
        flows=tuple(flows),
        steps=tuple(merged),
        hibernate=rng.random() < 0.5,
    )


def _step(kind: str, node: int, point: int, rng: random.Random) -> Step:
    if kind == "arm":
        return Step("arm", node, point * 100 + rng.randint(1, 4))
    if kind == "advance":
        return Step("advance", 0, rng.choice((1, 5, 30)))
    if kind in ("deliver", "duplicate", "delay"):
        return Step(kind, node, rng.randrange(8))
    return Step(kind, node, 0)


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    """Hypothesis strategy over schedules (shrinks towards fewer flows, steps and faults)."""
    flow_count = draw(st.integers(1, 6))
    flows = []
    for _ in range(flow_count):
        kind = draw(st.sampled_from(KINDS))
        node = draw(st.integers(0, 2))
        others = draw(st.permutations([n for n in range(3) if n != node]))
        amount = draw(st.sampled_from((1, 50, 4_000, 2_000_000)))
        flows.append(_flow_spec(kind, node, list(others), amount))
    other_steps = draw(
        st.lists(
            st.builds(
                Step,
                kind=st.sampled_from(STEP_KINDS),
                node=st.integers(0, 2),
                arg=st.integers(0, len(CRASH_POINTS) * 100 - 1),
            ),
            max_size=60,
        )
    )
    positions = sorted(
        draw(st.lists(st.integers(0, len(other_steps)), min_size=flow_count, max_size=flow_count))
    )
    steps: list[Step] = []
    flow_index = 0
    for index in range(len(other_steps) + 1):
        while flow_index < flow_count and positions[flow_index] == index:
            steps.append(Step("start", arg=flow_index))
            flow_index += 1
        if index < len(other_steps):
            steps.append(other_steps[index])
    probability = st.sampled_from((0.0, 0.0, 0.1, 0.3))
    return Schedule(
        seed=draw(st.integers(0, 2**31)),
        drop=draw(probability),
        duplicate=draw(probability),
        delay=draw(probability),
        reorder=draw(probability),
        flows=tuple(flows),
        steps=tuple(steps),
        hibernate=draw(st.booleans()),
    )


# --- running a schedule --------------------------------------------------------------------


@attrs.define
class RunReport:
    """What a run did (the campaign adds these up)."""

    rounds: int = 0
    crashes: int = 0
    restarts: int = 0
    flows: int = 0


def _start(net: MockNetwork, spec: FlowSpec) -> FlowHandle[Any]:
    nodes = net.nodes
    me = nodes[spec.node]
    parties = [nodes[i].party for i in spec.others]
    if spec.kind == "ping":
        return me.start_flow(PingFlow(parties[0]))
    if spec.kind == "payment":
        return me.start_flow(PaymentFlow(parties[0], spec.amount))
    if spec.kind == "trade":
        return me.start_flow(BuyerFlow(parties[0], parties[1], "widget", 2, spec.amount))
    if spec.kind == "quotes":
        return me.start_flow(CollectQuotesFlow(parties))
    return me.start_flow(SleepyFlow(float(spec.amount % 7 + 1)))


def run_schedule(schedule: Schedule, directory: Path | None = None) -> RunReport:
    """Play ``schedule``, drain the network, check every invariant (see the module doc)."""
    with tempfile.TemporaryDirectory() as temporary:
        workdir = directory or Path(temporary)
        faults = Faults(
            drop=schedule.drop,
            duplicate=schedule.duplicate,
            delay=schedule.delay,
            reorder=schedule.reorder,
        )
        net = MockNetwork(
            cordapps=CORDAPPS,
            seed=schedule.seed,
            faults=faults,
            directory=workdir,
            hibernate_after=0 if schedule.hibernate else None,
        )
        try:
            return _play(net, schedule)
        except InvariantViolation:
            raise
        except Exception as error:
            raise InvariantViolation(
                f"{type(error).__name__}: {error}\n{_replay_hint(schedule)}"
            ) from error
        finally:
            net.stop_nodes()


def _replay_hint(schedule: Schedule) -> str:
    return f"replay: python -m tests.campaign --replay '{schedule.to_json()}'"


def _play(net: MockNetwork, schedule: Schedule) -> RunReport:
    for name in NAMES:
        node = net.create_node(name)
        LEDGER_METADATA.create_all(node.node.database.engine)  # type: ignore[union-attr]
    report = RunReport(flows=len(schedule.flows))
    handles: dict[int, FlowHandle[Any]] = {}
    for step in schedule.steps:
        mock = net.nodes[step.node]
        if step.kind == "start":
            starter = net.nodes[schedule.flows[step.arg].node]
            with starter.crashes_paused():
                handles[step.arg] = _start(net, schedule.flows[step.arg])
        elif step.kind == "node":
            mock.run_once()
        elif step.kind == "network":
            net.run_once()
        elif step.kind == "restart":
            mock.restart()
            report.restarts += 1
        elif step.kind == "arm":
            point, nth = CRASH_POINTS[step.arg // 100 % len(CRASH_POINTS)], max(1, step.arg % 100)
            mock.crash_at(point, min(nth, 4))
        elif step.kind == "advance":
            net.clock.advance(max(step.arg, 1))
        elif step.kind == "release":
            net.messaging.flush_delayed()
        elif step.kind == "deliver":
            net.messaging.deliver_one(mock.name, step.arg)
            mock.run_round()
        elif step.kind == "duplicate":
            net.messaging.duplicate_one(mock.name, step.arg)
        elif step.kind == "delay":
            net.messaging.delay_one(mock.name, step.arg, 1 + step.arg % 5)
        elif step.kind == "hibernate":
            _hibernate_all(mock)
        elif step.kind == "wake":
            _wake_all(mock)
        report.rounds += 1
    for mock in net.nodes:
        mock.disarm()
    report.rounds += net.run_network()
    report.crashes = sum(mock.crashes for mock in net.nodes)
    try:
        _check(net, schedule, handles)
    except AssertionError as error:
        raise InvariantViolation(f"{error}\n{_replay_hint(schedule)}") from error
    return report


def _hibernate_all(mock: MockNode) -> None:
    """Hibernate every waiting flow of ``mock`` (a crash in the commit first restarts it)."""
    manager = mock.node.manager
    try:
        manager.dormancy.hibernate([state.flow_id for state in manager.live_flows()])
    except SimulatedCrash:
        mock.crashes += 1
        mock.restart()


def _wake_all(mock: MockNode) -> None:
    """Restore every dormant flow of ``mock`` (a crash while restoring restarts it)."""
    try:
        mock.node.manager.dormancy.restore_all()
    except SimulatedCrash:
        mock.crashes += 1
        mock.restart()


def _expected(schedule: Schedule) -> tuple[list[Counter[str]], list[Counter[str]]]:
    """Per node: how many results and errors of each flow class a correct run leaves."""
    results: list[Counter[str]] = [Counter() for _ in NAMES]
    errors: list[Counter[str]] = [Counter() for _ in NAMES]
    for spec in schedule.flows:
        me = spec.node
        if spec.kind == "ping":
            results[me]["PingFlow"] += 1
            results[spec.others[0]]["PongFlow"] += 1
        elif spec.kind == "payment":
            results[me]["PaymentFlow"] += 1
            results[spec.others[0]]["PayeeFlow"] += 1
        elif spec.kind == "trade":
            seller, approver = spec.others
            outcome = results if 2 * spec.amount <= APPROVAL_LIMIT_CENTS else errors
            outcome[me]["BuyerFlow"] += 1
            outcome[seller]["SellerFlow"] += 1
            results[approver]["ApproverFlow"] += 1
        elif spec.kind == "quotes":
            results[me]["CollectQuotesFlow"] += 1
            for supplier in spec.others:
                results[supplier]["QuoteResponder"] += 1
        else:
            results[me]["SleepyFlow"] += 1
    return results, errors


def _stored(net: MockNetwork, index: int, table: Any) -> Counter[str]:
    engine = net.nodes[index].node.database.engine  # type: ignore[union-attr]
    with engine.connect() as connection:
        names = connection.execute(select(table.c.flow_class)).scalars().all()
    return Counter(name.rsplit(".", 1)[-1] for name in names)


def _check(net: MockNetwork, schedule: Schedule, handles: dict[int, FlowHandle[Any]]) -> None:
    assert sorted(handles) == list(range(len(schedule.flows))), "not every flow was started"
    for index, spec in enumerate(schedule.flows):
        _check_result(net, spec, handles[index])
    results, errors = _expected(schedule)
    for index, name in enumerate(NAMES):
        stored_results = _stored(net, index, schema.node_flow_results)
        stored_errors = _stored(net, index, schema.node_flow_exceptions)
        assert stored_results == results[index], f"{name} results {stored_results}"
        assert stored_errors == errors[index], f"{name} errors {stored_errors}"
    _check_ledgers(net, schedule, handles)
    assert_drained(net)


def _check_result(net: MockNetwork, spec: FlowSpec, handle: FlowHandle[Any]) -> None:
    if spec.kind == "ping":
        assert handle.result() == "Pong"
    elif spec.kind == "payment":
        assert handle.result() == f"receipt {spec.amount}"
    elif spec.kind == "trade":
        if 2 * spec.amount > APPROVAL_LIMIT_CENTS:
            try:
                handle.result()
            except Exception as error:
                assert "trade refused by" in str(error), error
            else:
                raise AssertionError(f"trade of {spec.amount} above the limit was not refused")
        else:
            outcome = handle.result()
            assert isinstance(outcome, TradeOutcome) and outcome.decision.approved
            assert outcome.proposal.unit_price_cents == spec.amount
    elif spec.kind == "quotes":
        suppliers = [net.nodes[i].party.organisation for i in spec.others]
        assert handle.result() == [Quote(s, 100 + len(s)) for s in suppliers]
    else:
        assert handle.result() >= spec.amount % 7 + 1


def _check_ledgers(
    net: MockNetwork, schedule: Schedule, handles: dict[int, FlowHandle[Any]]
) -> None:
    rows = [ledger_entries(m.node.database.engine) for m in net.nodes]  # type: ignore[union-attr]
    expected_credits: list[Counter[str]] = [Counter() for _ in NAMES]
    for index, spec in enumerate(schedule.flows):
        if spec.kind != "payment":
            continue
        flow_id = handles[index].flow_id
        mine = [entry for fid, entry in rows[spec.node] if fid == flow_id]
        assert mine == [f"debit {spec.amount}", f"receipt {spec.amount}"], mine
        expected_credits[spec.others[0]][f"credit {spec.amount}"] += 1
    for index in range(len(NAMES)):
        credits = Counter(entry for _, entry in rows[index] if entry.startswith("credit"))
        assert credits == expected_credits[index], f"{NAMES[index]} credits {credits}"


__all__ = [
    "InvariantViolation",
    "RunReport",
    "Schedule",
    "SimulatedCrash",
    "run_schedule",
    "schedule_from_seed",
    "schedules",
]
