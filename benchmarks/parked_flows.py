"""Flows for benchmarks/hibernation.py: pairs that wait, and a ping/pong with a pause.

``ParkedFlow`` says hello to a party and waits, without a time limit, for an answer that never
comes; its ``ParkedResponder`` takes the hello and waits the same way. ``PausingPingFlow``
pings, sleeps, and pings again: between the two its ``PausingPongFlow`` waits for the second
ping (what a hibernated responder is woken for).
"""

from __future__ import annotations

from flows import FlowLogic, FlowSession, Party, initiated_by, initiating_flow
from flows.flow_logic import FOREVER


@initiating_flow
class ParkedFlow(FlowLogic[None]):
    """Say hello, then wait for ever."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> None:
        """Send "hello"; receive what never comes."""
        session = self.initiate_flow(self.peer)
        session.send("hello")
        session.receive(str, timeout=FOREVER)


@initiated_by(ParkedFlow)
class ParkedResponder(FlowLogic[None]):
    """Take the hello, then wait for ever."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        """Receive "hello"; receive what never comes."""
        self.session.receive(str)
        self.session.receive(str, timeout=FOREVER)


@initiating_flow
class PausingPingFlow(FlowLogic[str]):
    """Ping, sleep ``pause`` seconds, ping again; returns the second answer."""

    def __init__(self, peer: Party, pause: float) -> None:
        self.peer = peer
        self.pause = pause

    def call(self) -> str:
        """Two pings with a sleep between them."""
        session = self.initiate_flow(self.peer)
        session.send_and_receive(str, "first").unwrap(str)
        self.sleep(self.pause)
        return session.send_and_receive(str, "second").unwrap(str)


@initiated_by(PausingPingFlow)
class PausingPongFlow(FlowLogic[None]):
    """Answer both pings."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        """Answer "first", then wait for "second" and answer it."""
        for answer in ("one", "two"):
            self.session.receive(str).unwrap(str)
            self.session.send(answer)
