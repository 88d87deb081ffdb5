"""Flow failures keep their traceback: in the outcome, the handle's error, the node log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from flows import UnexpectedFlowEndException
from flows.cli.main import main
from flows.testing import MockNetwork
from flows.tracebacks import MAX_TRACEBACK_CHARS, FlowTraceback, bound_traceback
from tests.cordapp import BuggyFlow, FailingInitiator

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


def _cause_text(error: BaseException) -> str:
    cause = error.__cause__
    assert isinstance(cause, FlowTraceback), f"no traceback chained to {error!r}"
    return cause.text


def test_a_bug_in_flow_code_keeps_its_frames(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    handle = alice.start_flow(BuggyFlow("pear"))
    net.run_network()
    with pytest.raises(KeyError) as caught:
        handle.result()
    text = _cause_text(caught.value)
    first = text.splitlines()[0]
    assert first.startswith("raised in flow code at ") and first.endswith(" in look_up_price")
    assert "tests/cordapp.py" in first
    # The flow's frames from call() down, not the fiber's above it.
    assert "in call\n    return self.descend(self.depth)" in text
    assert "return prices[item]" in text
    assert "flows/node/fiber.py" not in text
    assert text.rstrip().endswith("KeyError: 'pear'")
    # Printed as the error's cause, above the caller's frames.
    assert "the flow's traceback on its node" in str(caught.value.__cause__)


def test_the_traceback_survives_a_restart(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    handle = alice.start_flow(BuggyFlow("pear"))
    net.run_network()
    alice.restart()
    with pytest.raises(KeyError) as caught:
        alice.flow_handle(handle.flow_id).result()
    assert "return prices[item]" in _cause_text(caught.value)
    stored = alice.node.database.checkpoints.stored_outcome(handle.flow_id)
    assert stored is not None and "look_up_price" in stored.traceback


def test_the_node_log_has_one_error_line_then_the_traceback(
    net: MockNetwork, caplog: pytest.LogCaptureFixture
) -> None:
    alice = net.create_node(ALICE)
    with caplog.at_level(logging.ERROR, logger="fiberflow.node"):
        handle = alice.start_flow(BuggyFlow("pear"))
        net.run_network()
    failures = [r for r in caplog.records if r.levelno == logging.ERROR and "failed" in r.msg]
    assert len(failures) == 1
    lines = failures[0].getMessage().splitlines()
    assert lines[0] == (
        f"flow {handle.flow_id} (tests.cordapp.BuggyFlow) failed: builtins.KeyError: 'pear'"
    )
    assert "return prices[item]" in "\n".join(lines[1:])


def test_a_deep_traceback_is_bounded_and_keeps_both_ends(net: MockNetwork) -> None:
    alice = net.create_node(ALICE)
    handle = alice.start_flow(BuggyFlow("pear", depth=400))
    net.run_network()
    with pytest.raises(KeyError) as caught:
        handle.result()
    text = _cause_text(caught.value)
    assert len(text) <= MAX_TRACEBACK_CHARS
    assert "characters of traceback cut" in text
    assert "in call\n" in text  # the head: where the flow's code starts
    assert text.rstrip().endswith("KeyError: 'pear'")  # the tail: where it raised


def test_the_counterparty_gets_no_traceback(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(FailingInitiator(bob.party, "internal"))
    net.run_network()
    with pytest.raises(UnexpectedFlowEndException) as caught:
        handle.result()
    initiator_side = _cause_text(caught.value)  # the initiator's own frames
    assert "deadbeef" not in initiator_side
    assert "FailingResponder" not in initiator_side
    responders = bob.node.database.checkpoints.stored_outcomes(
        [f for f in _failed_flow_ids(bob) if f != handle.flow_id]
    )
    (responder,) = responders.values()
    assert 'raise KeyError("secret internal detail 0xdeadbeef")' in responder.traceback


def test_a_killed_flow_has_no_traceback_and_logs_no_failure(
    net: MockNetwork, caplog: pytest.LogCaptureFixture
) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(FailingInitiator(bob.party, "end"))
    alice.kill_flow(handle.flow_id, "operator said so")
    with caplog.at_level(logging.ERROR, logger="fiberflow.node"):
        net.run_network()
    with pytest.raises(Exception) as caught:
        handle.result()
    assert caught.value.__cause__ is None
    assert not [r for r in caplog.records if "failed:" in r.getMessage()]


def test_bound_traceback_leaves_short_text_alone() -> None:
    assert bound_traceback("short") == "short"
    long = "x" * (MAX_TRACEBACK_CHARS * 3)
    assert len(bound_traceback(long)) <= MAX_TRACEBACK_CHARS


def _failed_flow_ids(node: object) -> list[str]:
    from sqlalchemy import select

    from persistence import schema

    database = node.node.database  # type: ignore[attr-defined]
    with database.engine.connect() as connection:
        query = select(schema.node_flow_exceptions.c.flow_id)
        return list(connection.execute(query).scalars())


def test_an_operator_sees_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    net = MockNetwork(cordapps=["tests.cordapp"], directory=tmp_path / "net")
    try:
        alice = net.create_node(ALICE)
        handle = alice.start_flow(BuggyFlow("pear"))
        net.run_network()
        config = tmp_path / "alice.toml"
        config.write_text(
            f'name = "{ALICE}"\n'
            f'database_url = "{alice.config.database_url}"\n'
            f'transport_url = "sqlite:///{tmp_path / "queue.db"}"\n'
        )
        assert main(["flow", "error", handle.flow_id, "--config", str(config)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"flow {handle.flow_id} (tests.cordapp.BuggyFlow) failed ")
        assert "builtins.KeyError: 'pear'" in out and "return prices[item]" in out
        assert main(["flow", "list", "--config", str(config), "--json"]) == 0
        (failed,) = json.loads(capsys.readouterr().out)["flows"]
        assert "look_up_price" in failed["traceback"]
        assert main(["flow", "list", "--config", str(config)]) == 0
        assert "fiberflow flow error ID" in capsys.readouterr().out
        assert main(["flow", "error", "nope", "--config", str(config)]) == 1
        assert "no failed flow nope" in capsys.readouterr().err
    finally:
        net.stop_nodes()
