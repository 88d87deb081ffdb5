"""The flows of ``benchmarks/message_walk.py``: one marked payload, sent once, received once.

:class:`WalkSender` sends :data:`MARKER` to its peer; :class:`WalkReceiver` receives it and,
as its ``receive()`` returns, ends the walk (:data:`WALK`), then answers so both flows end.
The module imports only the public flow API, so it runs against older checkouts too.
"""

from __future__ import annotations

from flows import FlowLogic, FlowSession, Party, initiated_by, initiating_flow

MARKER = "message-walk-marker-4f1d9a"
"""The payload whose path is traced (distinct enough to find inside any encoding)."""

WALK = {"on": True}
"""Set to False by the receiver once its ``receive()`` has returned the marker."""


@initiating_flow
class WalkSender(FlowLogic[None]):
    """Send the marker to ``recipient``, then wait for its answer."""

    def __init__(self, recipient: Party) -> None:
        self.recipient = recipient

    def call(self) -> None:
        """One send, one receive."""
        session = self.initiate_flow(self.recipient)
        session.send(MARKER)
        session.receive(str)


@initiated_by(WalkSender)
class WalkReceiver(FlowLogic[None]):
    """Receive the marker, end the walk, answer."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        """The walk ends as this receive returns."""
        self.session.receive(str).unwrap(lambda payload: None)
        WALK["on"] = False
        self.session.send("received")
