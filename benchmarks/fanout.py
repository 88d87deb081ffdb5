"""The flows of ``benchmarks/sessions.py``: one flow talks to many responders at once.

:class:`FanOutFlow` opens ``count`` sessions to one peer, sends a number on each and waits
for every reply with one ``receive_all``; :class:`FanOutResponder` answers with the double.
"""

from __future__ import annotations

from flows import FlowLogic, FlowSession, Party, initiated_by, initiating_flow
from flows.flow_logic import FOREVER


@initiating_flow
class FanOutFlow(FlowLogic[int]):
    """Open ``count`` sessions to ``peer``, send ``i`` on the i-th, ``receive_all`` replies."""

    def __init__(self, peer: Party, count: int) -> None:
        self.peer = peer
        self.count = count

    def call(self) -> int:
        """The sum of the replies (``count * (count - 1)`` when every peer doubles)."""
        sessions = [self.initiate_flow(self.peer) for _ in range(self.count)]
        for number, session in enumerate(sessions):
            session.send(number)
        replies = self.receive_all(int, sessions, timeout=FOREVER)
        return sum(reply.unwrap(int) for reply in replies)


@initiated_by(FanOutFlow)
class FanOutResponder(FlowLogic[None]):
    """Reply to the number received with its double."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        """Receive one number, send back twice it."""
        number = self.session.receive(int).unwrap(int)
        self.session.send(2 * number)
