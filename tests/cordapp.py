"""Flows used by the tests (a CorDapp: ``MockNetwork(cordapps=["tests.cordapp"])``)."""

from __future__ import annotations

import contextvars
import functools
import time
from typing import Any

import attrs
from sqlalchemy import Column, Integer, MetaData, String, Table, select
from sqlalchemy.exc import OperationalError

from flows import (
    FOREVER,
    FlowDefinitionError,
    FlowException,
    FlowLogic,
    FlowSession,
    FlowTimeoutException,
    OperationContext,
    Party,
    UnknownPartyError,
    initiated_by,
    initiating_flow,
    serializable,
)

# Flow code may not normally depend on mutable globals; tests use these on purpose to make
# a flow behave differently on replay (non-determinism) or to count side effects.
BEHAVIOUR: dict[str, object] = {}


class InsufficientFundsException(FlowException):
    """A FlowException subclass that crosses the wire with its class."""


@initiating_flow
class EchoFlow(FlowLogic[list[str]]):
    """Send each word to the peer; collect its echoes."""

    def __init__(self, peer: Party, words: list[str]) -> None:
        self.peer = peer
        self.words = words

    def call(self) -> list[str]:
        session = self.initiate_flow(self.peer)
        echoes = []
        for word in self.words:
            echoes.append(session.send_and_receive(str, word).unwrap(lambda w: w))
        session.send("")
        return echoes


@initiated_by(EchoFlow)
class EchoResponder(FlowLogic[int]):
    """Echo words upper-cased until an empty string; return how many."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> int:
        count = 0
        while True:
            word = self.session.receive(str).unwrap(lambda w: w)
            if not word:
                return count
            count += 1
            self.session.send(word.upper())


@initiating_flow
class FailingInitiator(FlowLogic[str]):
    """Ask the peer to fail in the given way, then wait for an answer that never comes."""

    def __init__(self, peer: Party, how: str) -> None:
        self.peer = peer
        self.how = how

    def call(self) -> str:
        session = self.initiate_flow(self.peer)
        return session.send_and_receive(str, self.how).unwrap(lambda m: m)


@initiated_by(FailingInitiator)
class FailingResponder(FlowLogic[None]):
    """Fail with a FlowException, its subclass, an internal error, or end silently."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        how = self.session.receive(str).unwrap(lambda m: m)
        if how == "flow_exception":
            raise FlowException("no can do: the vault is empty")
        if how == "subclass":
            raise InsufficientFundsException("balance 12 < 40")
        if how == "internal":
            raise KeyError("secret internal detail 0xdeadbeef")
        if how == "end":
            return None
        raise AssertionError(how)


@initiating_flow
class UnansweredFlow(FlowLogic[str]):
    """Initiates a flow the peer has no responder for."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        return self.initiate_flow(self.peer).send_and_receive(str, "anyone?").unwrap(str)


@initiating_flow
class WrongTypeFlow(FlowLogic[int]):
    """Expects an int where the responder sends a str."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> int:
        session = self.initiate_flow(self.peer)
        return session.send_and_receive(int, "what is 6 x 7?").unwrap(lambda n: n)


@initiated_by(WrongTypeFlow)
class WrongTypeResponder(FlowLogic[None]):
    """Answers with a str."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        self.session.receive(str)
        self.session.send("forty-two")


@serializable
@attrs.frozen
class Quote:
    """A price quote."""

    supplier: str
    price: int


@initiating_flow
class CollectQuotesFlow(FlowLogic[list[Quote]]):
    """Ask several suppliers at once with receive_all; results follow the session order."""

    def __init__(self, suppliers: list[Party]) -> None:
        self.suppliers = suppliers

    def call(self) -> list[Quote]:
        sessions = [self.initiate_flow(s) for s in self.suppliers]
        for session in sessions:
            session.send("widget")
        return [q.unwrap(lambda x: x) for q in self.receive_all(Quote, sessions)]


@initiated_by(CollectQuotesFlow)
class QuoteResponder(FlowLogic[None]):
    """Quote a price derived from the node's name."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        self.session.receive(str)
        me = self.our_identity.organisation
        self.session.send(Quote(me, 100 + len(me)))


class InlinedGreeting(FlowLogic[str]):
    """An inlined sub flow: uses its parent's session."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> str:
        return self.session.send_and_receive(str, "hello").unwrap(lambda m: m)


@initiating_flow
class ParentFlow(FlowLogic[tuple[str, str]]):
    """Uses an inlined sub flow on its own session and an initiating sub flow to a third."""

    def __init__(self, peer: Party, third: Party) -> None:
        self.peer = peer
        self.third = third

    def call(self) -> tuple[str, str]:
        session = self.initiate_flow(self.peer)
        greeting = self.sub_flow(InlinedGreeting(session))
        relayed = self.sub_flow(ChildInitiatingFlow(self.third))
        return greeting, relayed


@initiated_by(ParentFlow)
class ParentResponder(FlowLogic[None]):
    """Answers the inlined greeting."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        self.session.receive(str)
        self.session.send("hi from " + self.our_identity.organisation)


@initiating_flow
class ChildInitiatingFlow(FlowLogic[str]):
    """An initiating sub flow: its peer starts ChildResponder, not ParentResponder."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        return self.initiate_flow(self.peer).send_and_receive(str, "child").unwrap(str)


@initiated_by(ChildInitiatingFlow)
class ChildResponder(FlowLogic[None]):
    """Answers the child flow."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        got = self.session.receive(str).unwrap(str)
        self.session.send(f"{got} seen by {self.our_identity.organisation}")


class SleepyFlow(FlowLogic[float]):
    """Sleep, then return how long it slept by the journaled clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def call(self) -> float:
        before = self.now()
        self.sleep(self.seconds)
        after = self.now()
        return (after - before).total_seconds()


class ShapeShifterFlow(FlowLogic[str]):
    """Sleeps, then records a value; on replay it may take another path (BEHAVIOUR)."""

    def call(self) -> str:
        if BEHAVIOUR.get("shape") == "changed":
            self.random()
        else:
            self.uuid()
        self.sleep(10)
        return "done"


class JournaledValuesFlow(FlowLogic[tuple[float, str, float]]):
    """Draw now/uuid/random, sleep (a checkpoint), return them: replay must give the same."""

    def call(self) -> tuple[float, str, float]:
        values = (self.now().timestamp(), self.uuid(), self.random())
        self.sleep(5)
        return values


# --- side effects in the node's own database -----------------------------------------------

LEDGER_METADATA = MetaData()
LEDGER = Table(
    "app_ledger",
    LEDGER_METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("flow_id", String(64), nullable=False),
    Column("entry", String(100), nullable=False),
)
"""A user table in the node database that flows write to through ``in_transaction``."""


def ledger_entries(engine: Any) -> list[tuple[str, str]]:
    """(flow id, entry) of every ledger row, in insertion order."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(LEDGER.c.flow_id, LEDGER.c.entry).order_by(LEDGER.c.id)
        ).all()
    return [(row.flow_id, row.entry) for row in rows]


@initiating_flow
class PaymentFlow(FlowLogic[str]):
    """Debit locally, pay the payee, record the receipt: two effects, each exactly once."""

    def __init__(self, payee: Party, amount: int) -> None:
        self.payee = payee
        self.amount = amount

    def call(self) -> str:
        session = self.initiate_flow(self.payee)
        flow_id = self.flow_id
        amount = self.amount
        self.in_transaction(
            lambda db: db.execute(LEDGER.insert().values(flow_id=flow_id, entry=f"debit {amount}")),
            "debit",
        )
        receipt = session.send_and_receive(str, amount).unwrap(lambda r: r)
        self.in_transaction(
            lambda db: db.execute(LEDGER.insert().values(flow_id=flow_id, entry=receipt)),
            "receipt",
        )
        return receipt


@initiated_by(PaymentFlow)
class PayeeFlow(FlowLogic[int]):
    """Credit the payment received and answer with a receipt."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> int:
        amount = self.session.receive(int).unwrap(lambda a: a)
        flow_id = self.flow_id
        self.in_transaction(
            lambda db: db.execute(
                LEDGER.insert().values(flow_id=flow_id, entry=f"credit {amount}")
            ),
            "credit",
        )
        self.session.send(f"receipt {amount}")
        return amount


@initiating_flow
class FailingEffectFlow(FlowLogic[str]):
    """Tells ``peer`` (if any) it is going on, then asks for an effect that always raises:
    a bug (``RuntimeError``), or with ``transient`` a locked database."""

    def __init__(self, peer: Party | None = None, transient: bool = False) -> None:
        self.peer = peer
        self.transient = transient

    def call(self) -> str:
        if self.peer is not None:
            self.initiate_flow(self.peer).send("going on")
            self.sleep(0.01)  # a checkpoint: the message is sent before the failing step
        self.in_transaction(functools.partial(_broken, self.transient), "broken")
        return "unreachable"


def _broken(transient: bool, _: Any) -> None:
    if transient:
        raise OperationalError("INSERT INTO ledger", {}, Exception("database is locked"))
    raise RuntimeError("the effect is broken")


@initiated_by(FailingEffectFlow)
class WaitingResponder(FlowLogic[str]):
    """Waits for a second message that never comes (it learns how its initiator ended)."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> str:
        self.session.receive(str)
        return self.session.receive(str, timeout=FOREVER).unwrap(str)


@initiating_flow
class FlakyEffectsFlow(FlowLogic[str]):
    """Two effects in two steps; each fails its first ``failures`` tries (counted in
    ``BEHAVIOUR``), then works."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def call(self) -> str:
        for step in ("first", "second"):
            key = f"flaky-{self.flow_id}-{step}"
            self.in_transaction(functools.partial(_fail_first_tries, key, self.failures), step)
            self.sleep(0.01)  # a checkpoint: the effect commits with it, in its own step
        return "both done"


def _fail_first_tries(key: str, failures: int, _: Any) -> None:
    tries = int(str(BEHAVIOUR.get(key, 0))) + 1
    BEHAVIOUR[key] = tries
    if tries <= failures:  # a transient error: the flow is not to blame
        raise OperationalError(f"{key} (try {tries})", {}, Exception("database is locked"))


# --- receive timeouts ----------------------------------------------------------------------


@initiating_flow
class PatientFlow(FlowLogic[str]):
    """Says hello and waits for an answer that never comes, with a timeout."""

    def __init__(self, peer: Party, timeout: float | None, catch: bool, linger: float = 0) -> None:
        self.peer = peer
        self.timeout = timeout
        self.catch = catch
        self.linger = linger

    def call(self) -> str:
        session = self.initiate_flow(self.peer)
        self.progress("Waiting for an answer")
        try:
            return session.send_and_receive(str, "hello", timeout=self.timeout).unwrap(str)
        except FlowTimeoutException as error:
            if not self.catch:
                raise
            if self.linger:
                self.sleep(self.linger)  # a checkpoint whose journal holds the timeout
            return f"gave up: {error}"


@initiated_by(PatientFlow)
class SilentResponder(FlowLogic[None]):
    """Takes the hello and then waits, without limit, for something that never comes."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        self.session.receive(str)
        self.session.receive(str, timeout=FOREVER)


# --- versions ------------------------------------------------------------------------------


@initiating_flow(version=3)
class VersionedFlow(FlowLogic[list[object]]):
    """Asks the responder what it knows of this flow's version and app."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> list[object]:
        return (
            self.initiate_flow(self.peer)
            .send_and_receive(list, "which version?")
            .unwrap(lambda answer: answer)
        )


@initiated_by(VersionedFlow)
class VersionedResponder(FlowLogic[None]):
    """Answers with the counterparty's flow version and app name."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        self.session.receive(str)
        info = self.session.counterparty_flow_info
        self.session.send([info.flow_version, info.app_name])


# --- sizes ---------------------------------------------------------------------------------


@initiating_flow
class BlobFlow(FlowLogic[int]):
    """Sends ``size`` bytes; the responder answers with their length, or fails with an error
    message of ``error_chars`` characters when that is not 0."""

    def __init__(self, peer: Party, size: int, error_chars: int = 0) -> None:
        self.peer = peer
        self.size = size
        self.error_chars = error_chars

    def call(self) -> int:
        session = self.initiate_flow(self.peer)
        blob = b"x" * self.size
        return session.send_and_receive(int, [blob, self.error_chars]).unwrap(lambda n: n)


@initiated_by(BlobFlow)
class BlobResponder(FlowLogic[None]):
    """Answers a BlobFlow (see there)."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        blob, error_chars = self.session.receive(list).unwrap(lambda item: item)
        if error_chars:
            raise FlowException("e" * error_chars)
        self.session.send(len(blob))


# --- flow code that does not suspend ------------------------------------------------------


class BusyFlow(FlowLogic[str]):
    """Computes (``how="compute"``), blocks in a system call (``how="block"``) or in its
    ``in_transaction`` effect (``how="effect"``) for ``seconds`` without suspending: what flow
    code must not do (docs/writing-flows.md)."""

    def __init__(self, seconds: float, how: str = "compute") -> None:
        self.seconds = seconds
        self.how = how

    def call(self) -> str:
        if self.how == "effect":  # in the step's transaction: the write lock is held
            seconds = self.seconds
            self.in_transaction(lambda _: time.sleep(seconds), "slow")  # named by the watchdog
            self.sleep(0.01)  # a checkpoint: the effect runs in its transaction
        elif self.how == "block":
            time.sleep(self.seconds)  # the line the watchdog names
        else:
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:  # the line the watchdog names
                pass
        return "done"


@initiating_flow
class AskFragileFlow(FlowLogic[str]):
    """Asks a responder whose first step's effect has a bug (see FragileResponder)."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        return self.initiate_flow(self.peer).send_and_receive(str, "well?").unwrap(str)


@initiated_by(AskFragileFlow)
class FragileResponder(FlowLogic[str]):
    """Its effect raises before its first checkpoint: it never committed anything."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> str:
        self.session.receive(str)
        self.in_transaction(functools.partial(_broken, False), "broken")
        self.session.send("unreachable")
        return "unreachable"


FLOW_CONTEXT: contextvars.ContextVar[str] = contextvars.ContextVar("flow_context", default="unset")
"""Set by :class:`ContextVarFlow`: no other flow may see what one flow set."""


class ContextVarFlow(FlowLogic[tuple[str, str]]):
    """Read FLOW_CONTEXT, set it, suspend; return what it found and what it sees after."""

    def __init__(self, mark: str) -> None:
        self.mark = mark

    def call(self) -> tuple[str, str]:
        found = FLOW_CONTEXT.get()
        FLOW_CONTEXT.set(self.mark)
        self.now()  # a suspension: the flow's context must come back with it
        return found, FLOW_CONTEXT.get()


# --- continuing as new -------------------------------------------------------------------


KEYS_SEEN: list[str] = []
"""Idempotency keys the looping flow's operations were given (a test clears it)."""


def _note_key(context: OperationContext) -> str:
    KEYS_SEEN.append(context.idempotency_key)
    return context.idempotency_key


class LoopingFlow(FlowLogic[int]):
    """Sleeps a second, ``left`` more times, each time as a new run; returns the runs done.

    With ``operations`` each run calls an external operation first.
    """

    def __init__(self, left: int, done: int = 0, operations: bool = False) -> None:
        self.left = left
        self.done = done
        self.operations = operations

    def call(self) -> int:
        if self.operations:
            self.call_external(_note_key)
        self.progress(f"run {self.done}")
        self.sleep(1.0)
        if self.left == 0:
            return self.done
        self.continue_as_new(self.left - 1, self.done + 1, self.operations)


@initiating_flow
class AskToContinueFlow(FlowLogic[str]):
    """Asks the peer's responder to continue as new; returns what it answers."""

    def __init__(self, peer: Party) -> None:
        self.peer = peer

    def call(self) -> str:
        session = self.initiate_flow(self.peer)
        return session.send_and_receive(str, "again").unwrap(str)


@initiated_by(AskToContinueFlow)
class ContinuingResponder(FlowLogic[None]):
    """Tries to continue as new (a responder cannot) and answers with what it was told."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        self.session.receive(str)
        try:
            self.continue_as_new(None)
        except FlowDefinitionError as error:
            self.session.send(f"refused: {error}")


def look_up_price(prices: dict[str, int], item: str) -> int:
    """A helper with the bug: it assumes every item has a price."""
    return prices[item]


class BuggyFlow(FlowLogic[int]):
    """Fails with a KeyError in a helper of flow code (a bug, not a FlowException)."""

    def __init__(self, item: str, depth: int = 0) -> None:
        self.item = item
        self.depth = depth

    def call(self) -> int:
        return self.descend(self.depth)

    def descend(self, depth: int) -> int:
        if depth > 0:
            return self.descend_again(depth - 1)  # two functions: no "repeated" lines
        return look_up_price({"apple": 3}, self.item)

    def descend_again(self, depth: int) -> int:
        return self.descend(depth)


@initiating_flow
class AskStrangerFlow(FlowLogic[str]):
    """Initiates a flow with ``peer``; with ``fallback``, asks it instead if ``peer`` is unknown."""

    def __init__(self, peer: Party, fallback: Party | None = None) -> None:
        self.peer = peer
        self.fallback = fallback

    def call(self) -> str:
        try:
            session = self.initiate_flow(self.peer)
            after_initiate = BEHAVIOUR.get("after_initiate")
            if callable(after_initiate):  # a test's hook: the peer leaves the network now
                after_initiate()
        except UnknownPartyError:
            if self.fallback is None:
                raise
            self.progress("stranger unknown: asking the fallback")
            session = self.initiate_flow(self.fallback)
        return session.send_and_receive(str, "hello?").unwrap(str)


@initiated_by(AskStrangerFlow)
class StrangerResponder(FlowLogic[None]):
    """Answers whoever asks."""

    def __init__(self, session: FlowSession) -> None:
        self.session = session

    def call(self) -> None:
        self.session.receive(str).unwrap(str)
        self.session.send("hello")
