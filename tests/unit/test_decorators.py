"""Decorators check flow classes when applied, with a one-line fix in the message."""

from __future__ import annotations

import pytest

from flows import (
    FlowDefinitionError,
    FlowLogic,
    FlowSession,
    initiated_by,
    initiating_flow,
    serializable,
    startable_by_rpc,
)
from flows.cordapps import CordappError, Cordapps
from samples.pingpong import PingFlow


def test_initiating_flow_must_define_call() -> None:
    class NoCall(FlowLogic[None]):
        pass

    with pytest.raises(FlowDefinitionError, match=r"does not define call\(\)"):
        initiating_flow(NoCall)


def test_flows_must_be_module_level() -> None:
    class Local(FlowLogic[None]):
        def call(self) -> None:
            return None

    with pytest.raises(FlowDefinitionError, match="move it to module level"):
        initiating_flow(Local)


def test_decorators_need_flow_logic_subclasses() -> None:
    with pytest.raises(FlowDefinitionError, match="FlowLogic subclasses"):
        startable_by_rpc(int)  # type: ignore[type-var]


def test_initiated_by_needs_an_initiating_flow() -> None:
    class Plain(FlowLogic[None]):
        def call(self) -> None:
            return None

    with pytest.raises(FlowDefinitionError, match="put @initiating_flow above"):
        initiated_by(Plain)


def test_responder_constructor_must_take_the_session() -> None:
    class NoSession(FlowLogic[None]):
        def __init__(self) -> None:
            pass

        def call(self) -> None:
            return None

    NoSession.__qualname__ = "NoSession"  # pretend module level: the constructor is the point
    with pytest.raises(FlowDefinitionError, match=r"__init__\(self, session: FlowSession\)"):
        initiated_by(PingFlow)(NoSession)


def test_bad_version_is_refused() -> None:
    with pytest.raises(FlowDefinitionError, match="version"):
        initiating_flow(version=0)


def test_serializable_needs_attrs() -> None:
    class NotAttrs:
        pass

    with pytest.raises(FlowDefinitionError, match="@attrs.frozen"):
        serializable(NotAttrs)


def test_two_responders_for_one_initiator_in_one_node(tmp_path: object) -> None:
    with pytest.raises(CordappError, match="two responders for samples.pingpong.flows.PingFlow"):
        Cordapps(["samples.pingpong", "tests.duplicate_responder"])


def test_unknown_cordapp_module_is_named() -> None:
    with pytest.raises(CordappError, match="'no.such.cordapp' cannot be imported"):
        Cordapps(["no.such.cordapp"])


def test_cordapps_list_their_flows() -> None:
    apps = Cordapps(["samples.pingpong"])
    assert apps.flow_classes() == [
        "samples.pingpong.flows.PingFlow",
        "samples.pingpong.flows.PongFlow",
    ]
    responder = apps.responder_for("samples.pingpong.flows.PingFlow")
    assert responder is not None and responder.flow_class == "samples.pingpong.flows.PongFlow"
    assert apps.responder_for("samples.pingpong.flows.PongFlow") is None


def test_session_type_is_only_for_annotations() -> None:
    assert FlowSession.__doc__
