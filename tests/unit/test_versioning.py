"""Flow versions: the responder sees the initiator's; a node checks its checkpoints at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cordapps import Cordapps
from flows.decorators import InitiatingInfo
from flows.node.handles import FlowHospitalizedError
from flows.testing import MockNetwork
from statemachine.state import Checkpoint, FlowStatus, StartedLocally
from tests.conftest import CORDAPPS
from tests.cordapp import VersionedFlow
from tests.helpers import restore_now

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


def test_the_responder_sees_the_initiators_version_and_app(tmp_path: Path, backend: str) -> None:
    with MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=backend) as net:
        alice, bob = net.create_node(ALICE), net.create_node(BOB)
        handle = alice.start_flow(VersionedFlow(bob.party))
        net.run_network()
        assert handle.result() == [3, "tests"]


def test_a_checkpoint_of_another_flow_version_is_reported_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MockNetwork(cordapps=CORDAPPS, directory=tmp_path) as net:
        alice, bob = net.create_node(ALICE), net.create_node(BOB)
        handle = alice.start_flow(VersionedFlow(bob.party))
        alice.run_once()  # the session is open (version 3), the flow waits for Bob
        original = VersionedFlow.__dict__["_ff_initiating"]
        monkeypatch.setattr(
            VersionedFlow,
            "_ff_initiating",
            InitiatingInfo(original.flow_class, 4, original.app_name),
        )
        alice.restart()  # "upgraded" to version 4 with a version-3 flow in flight
        restore_now(alice)  # restored lazily: restore it now to look at it
        problem = alice.node.incompatible_flows[handle.flow_id]
        assert "version 3; version 4 is installed" in problem
        assert alice.flow_status(handle.flow_id) is FlowStatus.HOSPITALIZED
        with pytest.raises(FlowHospitalizedError, match="drain flows before"):
            handle.result()
        assert (
            handle.flow_id,
            "tests.cordapp.VersionedFlow",
            "HOSPITALIZED",
        ) in alice.checkpoints()
        monkeypatch.setattr(VersionedFlow, "_ff_initiating", original)  # roll back
        alice.retry_flow(handle.flow_id)
        net.run_network()
        assert handle.result() == [3, "tests"]


def test_a_checkpoint_of_a_class_that_is_gone_is_incompatible() -> None:
    checkpoint = Checkpoint(
        flow_id="f",
        origin=StartedLocally("no.such.module.GoneFlow", b""),
        status=FlowStatus.SUSPENDED,
        created_at=0.0,
    )
    problem = Cordapps(["samples.pingpong"]).compatibility_problem(checkpoint)
    assert problem is not None and "no.such.module.GoneFlow is not installed" in problem
