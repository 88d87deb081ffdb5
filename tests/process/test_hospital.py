"""The flow hospital: each rule with a test that injects its error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from flows.node.client import NodeClient, decode_outcome
from flows.node.effects import FlowEffectError
from flows.node.hospital import MAX_FLOW_FAILURES, Hospital, Treatment
from flows.node.inspection import list_flows
from flows.party import Party
from messaging.service import TransportError
from persistence.sql_transaction import SqlTransaction
from samples.pingpong import PingFlow
from tests.cordapp import FailingEffectFlow, FlakyEffectsFlow
from tests.process.test_runtime import client_of, running, two_nodes
from tests.waiting import wait_until


def locked() -> OperationalError:
    return OperationalError("COMMIT", {}, Exception("database is locked"))


@pytest.mark.parametrize(
    "error",
    [
        locked(),
        TransportError("broker gone"),
        ConnectionResetError("reset"),
        FlowEffectError("wrapped", "f1").with_traceback(None),
    ],
)
def test_transient_errors_are_resumed(error: BaseException) -> None:
    if isinstance(error, FlowEffectError):
        error.__cause__ = locked()  # an effect that met a locked database: not its fault
    diagnosis = Hospital(seed=1).diagnose(error)
    assert (diagnosis.rule, diagnosis.treatment) == ("transient", Treatment.RESUME)


def _locked_effect(flow_id: str) -> FlowEffectError:
    error = FlowEffectError("side effect 'x' raised OperationalError", flow_id)
    error.__cause__ = locked()
    return error


def test_a_flow_that_keeps_failing_is_kept_after_the_limit() -> None:
    hospital = Hospital(seed=1)
    rules = [hospital.diagnose(_locked_effect("f1")) for _ in range(MAX_FLOW_FAILURES)]
    assert [d.rule for d in rules] == ["transient"] * (MAX_FLOW_FAILURES - 1) + ["repeated_failure"]
    assert rules[-1].treatment is Treatment.KEEP and rules[-1].flow_id == "f1"
    assert "failed 3 times in a row" in rules[-1].reason


def test_any_other_error_a_flow_caused_fails_that_flow() -> None:
    diagnosis = Hospital().diagnose(FlowEffectError("side effect 'x' raised ValueError", "f1"))
    assert (diagnosis.rule, diagnosis.treatment, diagnosis.flow_id) == (
        "flow_error",
        Treatment.FAIL,
        "f1",
    )


def test_anything_else_is_an_unknown_error_that_is_resumed() -> None:
    diagnosis = Hospital().diagnose(ValueError("bug"))
    assert (diagnosis.rule, diagnosis.treatment) == ("unknown", Treatment.RESUME)


def test_the_backoff_grows_is_capped_and_jittered() -> None:
    hospital = Hospital(seed=3)
    waits = []
    for _ in range(12):
        hospital.diagnose(ValueError("x"))
        waits.append(hospital.backoff_seconds())
    assert 0.05 <= waits[0] <= 0.1
    assert waits[5] > waits[0]
    assert all(w <= 30.0 for w in waits) and waits[-1] >= 15.0
    hospital.recovered()
    hospital.diagnose(ValueError("x"))
    assert hospital.backoff_seconds() <= 0.1


def test_a_transient_database_error_resumes_from_the_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    commit = SqlTransaction.commit
    failures = {"left": 3}

    def flaky_commit(self: SqlTransaction) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise locked()  # the executor rolls the transaction back
        commit(self)

    client = client_of(alice)
    try:
        with running([alice, bob]) as processes:
            monkeypatch.setattr(SqlTransaction, "commit", flaky_commit)
            flow_ids = client.start_flows([PingFlow(Party(bob.name)) for _ in range(5)])
            outcomes = client.wait(flow_ids, timeout=60)
            assert [decode_outcome(outcomes[f]) for f in flow_ids] == ["Pong"] * 5
            assert sum(p.recoveries for p in processes) == 3
    finally:
        client.close()


def test_a_flow_whose_effect_has_a_bug_fails_and_its_counterparty_is_told(
    tmp_path: Path,
) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    client = client_of(alice)
    bobs = client_of(bob)
    try:
        with running([alice, bob]) as processes:
            (broken,) = client.start_flows([FailingEffectFlow(Party(bob.name))])
            pings = client.start_flows([PingFlow(Party(bob.name)) for _ in range(3)])
            outcomes = client.wait([broken, *pings], timeout=60)
            assert [decode_outcome(outcomes[f]) for f in pings] == ["Pong"] * 3
            with pytest.raises(FlowEffectError, match="RuntimeError: the effect is broken"):
                decode_outcome(outcomes[broken])
            # Pinned on the flow and diagnosed once (no retries of a bug); the node itself
            # never stopped for it (issue 12: quarantine, not node-wide retry).
            assert processes[0].hospital.pinned == 1
            assert processes[0].recoveries == 0
            wait_until(lambda: _responder_error(bobs) is not None, "Bob's responder to fail")
            assert _responder_error(bobs) == "flows.errors.UnexpectedFlowEndException"
    finally:
        client.close()
        bobs.close()


def _responder_error(client: NodeClient) -> str | None:
    from sqlalchemy import select

    from persistence import schema

    table = schema.node_flow_exceptions
    with client.database.engine.connect() as connection:
        found = connection.execute(
            select(table.c.exception_class).where(table.c.flow_class.like("%WaitingResponder"))
        ).first()
    return None if found is None else str(found.exception_class)


def test_a_flow_that_fails_again_and_again_is_kept_while_the_others_go_on(tmp_path: Path) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    client = client_of(alice)
    try:
        with running([alice, bob]) as processes:
            (broken,) = client.start_flows([FailingEffectFlow(Party(bob.name), transient=True)])
            pings = client.start_flows([PingFlow(Party(bob.name)) for _ in range(3)])
            outcomes = client.wait(pings, timeout=60)
            assert [decode_outcome(outcomes[f]) for f in pings] == ["Pong"] * 3
            kept = _wait_for_status(alice, broken, "HOSPITALIZED")
            assert "failed 3 times in a row" in kept["error"]

            # The counterparty is not told: its responder still waits. (Its first message may
            # still be on its way: Alice's relay retries it until Bob is in her network map.)
            def responder_statuses() -> list[str]:
                return [f["status"] for f in list_flows(bob) if f["class"] == "WaitingResponder"]

            wait_until(
                lambda: responder_statuses() == ["SUSPENDED"],
                "Bob's responder to wait for the second message",
                explain=lambda: str(responder_statuses()),
            )
            assert _responder_error(client_of(bob)) is None
            assert processes[0].hospital.pinned == MAX_FLOW_FAILURES
            assert processes[0].recoveries == 0  # the others never waited for it
        with running([alice]) as again:  # a restart keeps it in the hospital
            _wait_for_status(alice, broken, "HOSPITALIZED")
            assert again[0].recoveries == 0
    finally:
        client.close()


def test_failures_in_a_row_count_again_once_the_flow_gets_past_the_step(tmp_path: Path) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    client = client_of(alice)
    try:
        with running([alice, bob]) as processes:
            # Each of its two steps fails twice before it works: 4 failures, never 3 in a row.
            (flow_id,) = client.start_flows([FlakyEffectsFlow(MAX_FLOW_FAILURES - 1)])
            outcomes = client.wait([flow_id], timeout=60)
            assert decode_outcome(outcomes[flow_id]) == "both done"
            assert processes[0].hospital.pinned == 2 * (MAX_FLOW_FAILURES - 1)
            assert processes[0].recoveries == 0
    finally:
        client.close()


def _wait_for_status(config: Any, flow_id: str, status: str) -> dict[str, Any]:
    def found() -> list[dict[str, Any]]:
        return [f for f in list_flows(config) if f["flow_id"] == flow_id and f["status"] == status]

    wait_until(
        lambda: bool(found()),
        f"{flow_id} to reach {status}",
        explain=lambda: str(list_flows(config)),
    )
    return found()[0]
