"""PingFlow sends "Ping" to a party; the party's PongFlow answers "Pong"."""

from __future__ import annotations

from flows import FlowLogic, FlowSession, Party, initiated_by, initiating_flow, startable_by_rpc


@initiating_flow
@startable_by_rpc
class PingFlow(FlowLogic[str]):
    """Send "Ping" to ``recipient`` and return its reply."""

    def __init__(self, recipient: Party) -> None:
        self.recipient = recipient

    def call(self) -> str:
        """Open a session, send "Ping", return the answer."""
        session = self.initiate_flow(self.recipient)
        return session.send_and_receive(str, "Ping").unwrap(lambda m: m)


@initiated_by(PingFlow)
class PongFlow(FlowLogic[str]):
    """Answer a PingFlow with "Pong"; returns the ping it received."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> str:
        """Receive the ping, send "Pong"."""
        ping = self.session.receive(str).unwrap(lambda m: m)
        self.session.send("Pong")
        return ping
