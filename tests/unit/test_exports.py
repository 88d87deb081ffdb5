from __future__ import annotations

import flows


def test_public_api_names_are_pinned() -> None:
    assert flows.__all__ == sorted(flows.__all__)
    required = {
        "FlowLogic",
        "FlowSession",
        "UntrustworthyData",
        "Party",
        "initiating_flow",
        "initiated_by",
        "startable_by_rpc",
        "FlowException",
        "UnexpectedFlowEndException",
        "FlowNonDeterminismError",
    }
    assert required <= set(flows.__all__)
    for name in flows.__all__:
        assert getattr(flows, name).__doc__, f"{name} has no docstring"
