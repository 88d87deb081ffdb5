"""Flows for the blob check's tests: a conversation that finishes while its initiator lives on.

:class:`ClosingFlow` sends two words on a session and closes it (its end is the last message
of that conversation, by its own count), then, a minute later, asks the same peer again on a
second session, takes the answer and sleeps for a day: its checkpoint, which holds both
sessions, stays in the database while the responder of the first conversation has finished.

:class:`NappingFlow` leaves a confirmed session in a live checkpoint that waits only on
time; :class:`HelloFlow` ends with one, the confirmation its only message taken in.
"""

from __future__ import annotations

from flows import FOREVER, FlowLogic, FlowSession, Party, initiated_by, initiating_flow
from flows.errors import UnexpectedFlowEndException
from tests.analytics_data import LingeringResponder

DAY = 86_400.0


@initiating_flow
class ClosingFlow(FlowLogic[str]):
    """Says "one", "two" and closes the session; a minute later asks "again" on a new one."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        first = self.initiate_flow(self.peer)
        first.send("one")
        first.send("two")
        first.close()
        self.sleep(60)  # the first responder finishes before the second conversation
        second = self.initiate_flow(self.peer)
        answer = second.send_and_receive(str, "again").unwrap(lambda m: m)
        self.sleep(DAY)
        return answer


@initiated_by(ClosingFlow)
class ClosingResponder(FlowLogic[str]):
    """Takes "one" and "two" (and then the end) and finishes; answers "again" with "ok"."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> str:
        first = self.session.receive(str, timeout=FOREVER).unwrap(lambda m: m)
        if first == "again":
            self.session.send("ok")
            return first
        second = self.session.receive(str, timeout=FOREVER).unwrap(lambda m: m)
        try:
            self.session.receive(str, timeout=FOREVER)
        except UnexpectedFlowEndException:  # the initiator's end, taken in
            return f"{first} {second}"
        raise AssertionError("the initiator sends nothing after two")


@initiating_flow
class NappingFlow(FlowLogic[str]):
    """Says hello, naps a second, then sleeps for a day without waiting on the session.

    The responder's confirmation arrives during the nap and is taken in (in memory: a
    sleeping flow commits nothing); the flow's next suspension, the day's sleep, commits it
    with its dedup id. So the checkpoint holds a confirmed session and its node one record of
    it, message 0, while the flow waits on nothing but time: what a refusal it caught would
    leave in the tables, but a confirmation in the blob.
    """

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        session = self.initiate_flow(self.peer)
        session.send("hello")
        self.sleep(1)
        self.sleep(DAY)
        return session.send_and_receive(str, "goodbye").unwrap(lambda m: m)


@initiated_by(NappingFlow)
class NappingResponder(LingeringResponder):
    """Waits for the hello and then for the goodbye (a day later), and answers."""


@initiating_flow
class HelloFlow(FlowLogic[str]):
    """Says hello, naps a second (taking in the responder's confirmation) and ends.

    Its only message taken in is the confirmation: what a refusal would leave on its side,
    but its row's session facts say the session was confirmed.
    """

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        session = self.initiate_flow(self.peer)
        session.send("hello")
        self.sleep(1)
        return "said hello"


@initiated_by(HelloFlow)
class HelloResponder(FlowLogic[str]):
    """Takes the hello, then the initiator's end, and finishes."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> str:
        hello = self.session.receive(str, timeout=FOREVER).unwrap(lambda m: m)
        try:
            self.session.receive(str, timeout=FOREVER)
        except UnexpectedFlowEndException:  # the initiator's end, taken in
            return hello
        raise AssertionError("the initiator sends nothing after hello")
