"""A second responder for PingFlow: a node may not install it beside samples.pingpong."""

from __future__ import annotations

from flows import FlowLogic, FlowSession, initiated_by
from samples.pingpong import PingFlow


@initiated_by(PingFlow)
class AnotherPongFlow(FlowLogic[None]):
    """Competes with PongFlow."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        self.session.send("Pang")
