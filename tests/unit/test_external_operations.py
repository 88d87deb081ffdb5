"""``FlowLogic.call_external``: operations off the scheduler, journaled, retried, timed out.

The operations here are real callables run on the node's real threads (and its event loop);
the clock that backoffs and timeouts count on is the test network's mock clock.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flows import FlowLogic
from flows.config.runtime import RuntimeConfig
from flows.errors import OperationFailedException, OperationTimeoutException
from flows.node.external_operations import OperationContext
from flows.node.handles import FlowHospitalizedError
from flows.node.inspection import list_flows
from flows.testing import MockNetwork, MockNode
from samples.pingpong import PingFlow
from samples.quotes import QuoteFlow
from samples.quotes.service import QuoteService
from statemachine.flow_error import ErrorKind
from statemachine.iorequests import RetryPolicy
from statemachine.state import FlowStatus
from tests.conftest import CORDAPPS
from tests.helpers import restore_now

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"

CALLS: Counter[str] = Counter()
"""Calls per idempotency key (what a deduplicating service would count)."""
ATTEMPTS: list[int] = []
RELEASE = threading.Event()
"""Blocking operations wait for this."""
STARTED = threading.Event()
FAILURES_LEFT = [0]
ORDER = ["first"]
"""Which operation ``ReorderedFlow`` asks for first (a test changes it: new code)."""


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    CALLS.clear()
    ATTEMPTS.clear()
    RELEASE.clear()
    STARTED.clear()
    FAILURES_LEFT[0] = 0
    ORDER[0] = "first"
    yield
    RELEASE.set()  # no thread of a failed test stays blocked


def lookup(context: OperationContext) -> dict[str, Any]:
    CALLS[context.idempotency_key] += 1
    ATTEMPTS.append(context.attempt)
    return {"key": context.idempotency_key, "label": context.label}


async def lookup_async(context: OperationContext) -> str:
    CALLS[context.idempotency_key] += 1
    await asyncio.sleep(0.01)
    return f"async {context.label}"


def flaky(context: OperationContext) -> int:
    CALLS[context.idempotency_key] += 1
    ATTEMPTS.append(context.attempt)
    if FAILURES_LEFT[0] > 0:
        FAILURES_LEFT[0] -= 1
        raise ConnectionError("the service is down")
    return context.attempt


def refuses(context: OperationContext) -> None:
    CALLS[context.idempotency_key] += 1
    raise PermissionError("no")


def blocks(context: OperationContext) -> str:
    CALLS[context.idempotency_key] += 1
    ATTEMPTS.append(context.attempt)
    STARTED.set()
    RELEASE.wait(30)
    return "released"


async def blocks_async(context: OperationContext) -> str:
    STARTED.set()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        CALLS["cancelled"] += 1
        raise
    return "slept"


def not_a_payload(context: OperationContext) -> object:
    return threading.Lock()


class LookupFlow(FlowLogic[list[Any]]):
    def call(self) -> list[Any]:
        first = self.call_external(lookup)
        second = self.call_external(lookup_async, label="second")
        self.sleep(1)  # a checkpoint that holds both results
        return [first, second]


class RetryingFlow(FlowLogic[int]):
    def __init__(self, attempts: int = 4) -> None:
        self.attempts = attempts

    def call(self) -> int:
        policy = RetryPolicy(
            attempts=self.attempts, backoff=10, jitter=0.5, retry_on=ConnectionError
        )
        result: int = self.call_external(flaky, retry=policy)
        return result


class CatchingFlow(FlowLogic[str]):
    def call(self) -> str:
        try:
            self.call_external(refuses, retry=RetryPolicy(attempts=5, retry_on=ConnectionError))
        except OperationFailedException as error:
            return f"caught: {error}"
        return "not raised"


class TimingOutFlow(FlowLogic[str]):
    def call(self) -> str:
        try:
            self.call_external(blocks, timeout=5, retry=RetryPolicy(attempts=2, backoff=1))
        except OperationTimeoutException as error:
            return f"timed out: {error}"
        return "finished"


class BlockingFlow(FlowLogic[str]):
    def call(self) -> str:
        result: str = self.call_external(blocks)
        return result


class AsyncBlockingFlow(FlowLogic[str]):
    def call(self) -> str:
        result: str = self.call_external(blocks_async)
        return result


class UncaughtFlow(FlowLogic[int]):
    def call(self) -> int:
        result: int = self.call_external(flaky)
        return result


class BadResultFlow(FlowLogic[str]):
    def call(self) -> str:
        try:
            self.call_external(not_a_payload)
        except OperationFailedException as error:
            return str(error)
        return "accepted"


class ReorderedFlow(FlowLogic[str]):
    def call(self) -> str:
        if ORDER[0] == "first":
            self.call_external(lookup, label="first")
        else:
            self.call_external(flaky, label="other")
        self.sleep(100)
        return "done"


@pytest.fixture
def network(tmp_path: Path) -> Iterator[MockNetwork]:
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path)
    yield net
    RELEASE.set()
    net.stop_nodes()


def test_an_operation_returns_its_result_with_a_key_of_its_step(network: MockNetwork) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(LookupFlow())
    network.run_network()
    first, second = handle.result()
    assert first == {"key": f"{handle.flow_id}:op:0", "label": "lookup"}
    assert second == "async second"
    assert {f"{handle.flow_id}:op:0": 1, f"{handle.flow_id}:op:1": 1} == CALLS


def test_a_replay_takes_results_from_the_journal(network: MockNetwork) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(LookupFlow())
    network.run_network(advance_clock=False)  # both done, the flow sleeps: committed
    assert alice.checkpoints()[0][2] == "SUSPENDED"
    alice.restart()
    network.run_network()
    assert handle.result()[1] == "async second"
    assert sum(CALLS.values()) == 2  # neither ran again


def test_other_flows_run_while_an_operation_blocks(network: MockNetwork) -> None:
    alice, bob = network.create_node(ALICE), network.create_node(BOB)
    blocked = alice.start_flow(BlockingFlow())
    pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(5)]
    network.run_network(operation_wait=0)  # runs all it can without waiting for operations
    assert STARTED.is_set()
    assert [p.result() for p in pings] == ["Pong"] * 5
    assert alice.flow_status(blocked.flow_id) is FlowStatus.SUSPENDED
    RELEASE.set()
    network.run_network()
    assert blocked.result() == "released"


def test_retries_wait_their_backoff_and_keep_the_key(network: MockNetwork) -> None:
    alice = network.create_node(ALICE)
    FAILURES_LEFT[0] = 2
    began = network.clock.now()
    handle = alice.start_flow(RetryingFlow())
    network.run_network()
    assert handle.result() == 3
    assert ATTEMPTS == [1, 2, 3]
    assert {f"{handle.flow_id}:op:0": 3} == CALLS
    # backoff 10 s then 20 s, each spread by at most half of itself
    assert 15 <= network.clock.now() - began <= 45


def test_the_retry_count_survives_a_restart(network: MockNetwork) -> None:
    alice = network.create_node(ALICE)
    FAILURES_LEFT[0] = 10
    handle = alice.start_flow(RetryingFlow(attempts=3))
    network.run_network(advance_clock=False)  # attempt 1 failed: waiting for attempt 2
    assert ATTEMPTS == [1]
    alice.restart()
    network.run_network()
    assert ATTEMPTS == [1, 2, 3]  # not 1 again: the count was in the checkpoint
    # RetryingFlow does not catch the last failure: it is kept in the hospital
    with pytest.raises(FlowHospitalizedError, match=r"ConnectionError.*attempt 3 of 3"):
        handle.result()


def test_a_failure_the_policy_does_not_retry_reaches_the_flow_at_once(
    network: MockNetwork,
) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(CatchingFlow())
    network.run_network()
    assert handle.result() == (
        "caught: refuses raised builtins.PermissionError: no (attempt 1 of 5)"
    )
    assert sum(CALLS.values()) == 1


def test_an_attempt_that_outlives_its_timeout_is_retried_then_raised(
    network: MockNetwork,
) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(TimingOutFlow())
    network.run_network(operation_wait=0.05)  # the threads never end: the mock clock moves on
    assert handle.result().startswith(
        "timed out: call_external(tests.unit.test_external_operations"
    )
    assert "did not finish within 5 s (attempt 2 of 2)" in handle.result()
    assert ATTEMPTS == [1, 2]


def test_an_uncaught_failure_keeps_the_flow_with_the_operation_pending_again(
    tmp_path: Path,
) -> None:
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path, hospital=True)
    try:
        alice = net.create_node(ALICE)
        FAILURES_LEFT[0] = 1
        handle = alice.start_flow(UncaughtFlow())
        net.run_network()
        assert alice.flow_status(handle.flow_id) is FlowStatus.HOSPITALIZED
        state = alice.node.manager.flow_state(handle.flow_id)
        assert state is not None and state.checkpoint.error is not None
        assert "ConnectionError: the service is down" in state.checkpoint.error.message
        assert len(state.checkpoint.journal) == 0  # the failure is not journaled: pending again
        alice.retry_flow(handle.flow_id)  # the service is back
        net.run_network()
        assert handle.result() == 1  # attempt 1 of a fresh run
        assert {f"{handle.flow_id}:op:0": 2} == CALLS
    finally:
        net.stop_nodes()


def test_killing_a_flow_abandons_its_operation(network: MockNetwork) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(AsyncBlockingFlow())
    network.run_network(operation_wait=0)
    assert STARTED.wait(5)
    alice.kill_flow(handle.flow_id)
    network.run_network()
    assert alice.node.operations.in_flight() == 0
    with pytest.raises(Exception, match="killed"):
        handle.result()
    for _ in range(500):  # the coroutine is cancelled on the node's loop
        if CALLS["cancelled"]:
            break
        threading.Event().wait(0.01)
    assert CALLS["cancelled"] == 1


def test_a_result_that_is_not_a_payload_fails_the_operation(network: MockNetwork) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(BadResultFlow())
    network.run_network()
    assert "not_a_payload returned a value that is not a payload" in handle.result()


def test_a_crash_after_the_end_and_before_the_journal_commits_runs_it_again_with_its_key(
    network: MockNetwork,
) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(LookupFlow())
    # The first operation's end is journaled in memory; the flow asks for the second one and
    # dies before that step commits: the first runs again, with the same key.
    alice.crash_at("before_transaction", nth=2)
    network.run_network()
    assert alice.crashes == 1
    assert handle.result()[0] == {"key": f"{handle.flow_id}:op:0", "label": "lookup"}
    assert CALLS[f"{handle.flow_id}:op:0"] == 2
    assert CALLS[f"{handle.flow_id}:op:1"] == 1


def test_asking_for_operations_in_another_order_on_replay_is_caught(
    network: MockNetwork,
) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(ReorderedFlow())
    network.run_network(advance_clock=False)
    ORDER[0] = "other"  # the flow's code changed while it slept
    alice.restart()
    restore_now(alice)  # restored lazily: restore it now to look at it
    network.run_network(advance_clock=False)
    assert alice.flow_status(handle.flow_id) is FlowStatus.HOSPITALIZED
    state = alice.node.manager.flow_state(handle.flow_id)
    assert state is not None and state.checkpoint.error is not None
    assert state.checkpoint.error.kind is ErrorKind.NON_DETERMINISM
    assert "RunOperation('first', 0, 'tests.unit.test_external_operations.lookup')" in (
        state.checkpoint.error.message
    )


def test_retry_policies_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="jitter must be between 0 and 1"):
        RetryPolicy(jitter=2)
    with pytest.raises(ValueError, match="retry_on takes exception classes"):
        RetryPolicy(retry_on=(42,))
    assert RetryPolicy(retry_on=OSError).retries(ConnectionError)
    assert not RetryPolicy(retry_on=OSError).retries(ValueError)


def test_the_quotes_sample_calls_its_http_service_once_per_key(network: MockNetwork) -> None:
    service = QuoteService(seed=1).start()
    try:
        alice = network.create_node(ALICE)
        handles = [alice.start_flow(QuoteFlow(symbol, service.url)) for symbol in ("AB", "CD")]
        network.run_network()
        quotes = [handle.result() for handle in handles]
    finally:
        service.stop()
    assert [quote["symbol"] for quote in quotes] == ["AB", "CD"]
    assert service.effective == {f"{h.flow_id}:op:0": 1 for h in handles}
    assert service.calls == service.effective


def test_flow_list_shows_the_operation_a_flow_waits_for(network: MockNetwork) -> None:
    alice = network.create_node(ALICE)
    handle = alice.start_flow(BlockingFlow())
    network.run_network(operation_wait=0)
    assert STARTED.wait(5)
    config = RuntimeConfig(ALICE, alice.node.config.database_url, "sqlite:///unused.db")
    (shown,) = [f for f in list_flows(config) if f["flow_id"] == handle.flow_id]
    assert shown["status"] == "SUSPENDED"
    assert shown["waiting_on"] == "operation blocks (attempt 1)"


def test_a_crash_at_every_boundary_runs_each_operation_at_least_once_and_the_flow_once(
    tmp_path: Path,
) -> None:
    def run(crash: tuple[str, int] | None) -> tuple[MockNode, str, Counter[str]]:
        CALLS.clear()
        net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path / f"run-{len(crashes)}")
        networks.append(net)
        alice = net.create_node(ALICE)
        handle = alice.start_flow(LookupFlow())
        alice.boundary_counts.clear()  # count from here, as crash_at does
        if crash is not None:
            alice.crash_at(*crash)
        net.run_network()
        assert handle.result()[0] == {"key": f"{handle.flow_id}:op:0", "label": "lookup"}
        assert alice.node.database.count("node_flow_results") == 1
        return alice, handle.flow_id, Counter(CALLS)

    networks: list[MockNetwork] = []
    crashes: list[tuple[str, int]] = []
    try:
        clean, _, calls = run(None)
        assert sorted(calls.values()) == [1, 1]
        points = [
            (point, nth)
            for point, count in clean.boundary_counts.items()
            for nth in range(1, count + 1)
        ]
        assert len(points) >= 10
        for point in points:
            crashes.append(point)
            alice, flow_id, calls = run(point)
            assert alice.crashes == 1, point
            for ordinal in (0, 1):  # at least once, and at most once more after one crash
                assert calls[f"{flow_id}:op:{ordinal}"] in (1, 2), (point, calls)
    finally:
        for net in networks:
            net.stop_nodes()
