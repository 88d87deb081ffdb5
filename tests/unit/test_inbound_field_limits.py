"""Maximal and over-limit fields through every path that stores inbound data (issue 12, item 1).

On PostgreSQL (which enforces column widths and refuses NUL characters in text) and on SQLite,
hypothesis draws inputs whose text fields are at, just under, just over or far over their
limits, in one-, two- and four-byte characters, sometimes with a NUL character:

* frames from unknown senders or with forged contents (to the node's dead letters, or to the
  transport's when a frame field is over its limit),
* session messages authenticated by a genuine peer whose fields are over their limits (the node's
  dead letters),
* genuine session messages at the limits: an initial message with the longest session id a
  peer may use, from a peer whose name is as long as a name may be, which starts a responder
  (dedup ids, checkpoints, outbox, results or exceptions of that flow), or is rejected for an
  unknown flow class of maximal length; and an error from the peer with a maximal exception
  class and message, which fails the responder.

After each batch the node must still serve (a ping/pong completes), nothing may be left
unacknowledged, every message within the limits must have been taken in, and nothing over a
limit may have been. ``FIBERFLOW_LIMITS_EXAMPLES`` sets the examples per backend (default 30).

The other tests here write hostile text straight into every dead-letter store: the node
database's, the non-durable store's and the SQL queue's.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import attrs
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from flows.testing import MockNetwork, MockNode
from foundation.bounded import DIGEST_MARK
from foundation.engine import drop_schema
from foundation.serialization import PAYLOADS
from messaging.codec import encode_session_message
from messaging.frame import FRAME_VERSION
from messaging.service import SESSION_TOPIC, Message
from messaging.sqlqueue import SqlQueueBroker, queue_dead_letters
from persistence import schema
from persistence.memory_store import InMemoryStore
from persistence.store import NodeDatabase
from samples.pingpong import PingFlow
from statemachine import limits
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.ports import InboundMessage
from statemachine.session_ids import (
    identity_tag,
    message_id,
    responder_session_id,
)
from statemachine.session_messages import (
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionErrorBody,
)

EXAMPLES = int(os.environ.get("FIBERFLOW_LIMITS_EXAMPLES", "30"))
PING = "samples.pingpong.flows.PingFlow"
CHARACTERS = ["a", "\u00e9", "\U0001d11e"]  # one, two and four bytes in UTF-8


def longest_name(head: str, character: str) -> str:
    return head + character * (limits.PARTY_NAME_CHARS - len(head))


ALICE = longest_name("O=Alice,L=London,C=GB,CN=", "\u00e9")
BOB = longest_name("O=Bob,L=New York,C=US,CN=", "\U0001d11e")
MALLORY = "O=Mallory,L=Nowhere,C=XX"


@attrs.frozen
class Hostile:
    """One input for Bob, and whether every field of it is within the limits."""

    frame: bytes
    message_id: str
    within: bool
    genuine: bool = False
    """Authenticated by Alice, within the limits and expected: Bob must take it in (id recorded)."""


def pack_frame(message_id: str, sender: str, data: bytes, tag: bytes = b"") -> bytes:
    """A frame as a careless or hostile sender writes it (no limits checked)."""
    fields = [FRAME_VERSION, message_id, SESSION_TOPIC, sender, data, tag]
    return bytes(msgpack.packb(fields, use_bin_type=True))


@st.composite
def text_of_length(draw: st.DrawFn, length: int, prefix: str = "") -> tuple[str, bool]:
    """Text of exactly ``length`` characters (``prefix`` first); True if it holds no NUL."""
    character = draw(st.sampled_from(CHARACTERS))
    text = (prefix + character * length)[:length]
    if length > len(prefix) and draw(st.integers(0, 5)) == 0:
        spot = draw(st.integers(len(prefix), length - 1))
        return text[:spot] + "\x00" + text[spot + 1 :], False
    return text, True


def around(limit: int) -> st.SearchStrategy[int]:
    """Lengths at the edges of ``limit``, and some way over it."""
    return st.sampled_from([limit - 1, limit, limit + 1, limit + 37, 2 * limit])


@st.composite
def forged(draw: st.DrawFn) -> list[Hostile]:
    """A frame from an unknown sender, or claiming to be Alice without her key's tag."""
    id_length = draw(around(limits.MESSAGE_ID_CHARS))
    mid, id_ok = draw(text_of_length(id_length, "N-"))
    if draw(st.booleans()):
        sender, sender_ok = draw(text_of_length(draw(around(limits.PARTY_NAME_CHARS)), "O=M,"))
    else:
        sender, sender_ok = ALICE, True
    within = id_ok and sender_ok
    within = within and id_length <= limits.MESSAGE_ID_CHARS and len(sender) <= 300
    data = draw(st.binary(max_size=40))
    return [Hostile(pack_frame(mid, sender, data, b"\x01" * 32), mid, within)]


@st.composite
def genuine_sessions(draw: st.DrawFn, alice: MockNode) -> list[Hostile]:
    """Session messages authenticated by Alice: an initial message, perhaps an error after it."""
    limit = limits.INITIATOR_SESSION_ID_CHARS
    tag = identity_tag(ALICE) + "-"
    length = draw(st.sampled_from([limit - 1, limit, limit + 1, limit + 2]))
    session, session_ok = draw(text_of_length(length, tag + uuid.uuid4().hex))
    known = draw(st.booleans())
    if known:
        flow_class, class_ok = PING, True
    else:
        class_length = draw(around(limits.FLOW_CLASS_CHARS))
        flow_class, class_ok = draw(text_of_length(class_length, "tests.Nope."))
    app_name, app_ok = draw(text_of_length(draw(around(limits.APP_NAME_CHARS)), "app"))
    payload = PAYLOADS.encode("Ping") if draw(st.booleans()) else None
    initial = InitialSessionMessage(session, flow_class, 1, app_name, payload)
    within = (
        session_ok
        and class_ok
        and app_ok
        and len(session) <= limit
        and len(flow_class) <= limits.FLOW_CLASS_CHARS
        and len(app_name) <= limits.APP_NAME_CHARS
    )
    first = message_id(session, 0)
    found = [authenticated(alice, first, encode_session_message(initial), within, within)]
    if draw(st.booleans()):
        class_length = draw(around(limits.EXCEPTION_CLASS_CHARS))
        exception_class, exception_ok = draw(text_of_length(class_length, "x.E"))
        text, text_ok = draw(text_of_length(limits.ERROR_MESSAGE_CHARS, "boom "))
        error = FlowError(ErrorKind.FLOW_EXCEPTION, exception_class, text)
        body = SessionErrorBody(error)
        after = ExistingSessionMessage(responder_session_id(session), 1, body)
        ok = within and exception_ok and text_ok and class_length <= 300
        # Surely taken in if its session opened and waits for it (no first payload); with a
        # first payload the responder may have ended first (then it is dropped as late).
        must = ok and known and payload is None
        mid = message_id(session, 1)
        found.append(authenticated(alice, mid, encode_session_message(after), ok, must))
    return found


def authenticated(alice: MockNode, mid: str, data: bytes, within: bool, must_take: bool) -> Hostile:
    """Authenticated by Alice; ``must_take``: Bob must take it in if its id is within the limit."""
    message = alice.node.authenticator.authenticate(Message(mid, SESSION_TOPIC, ALICE, data), BOB)
    frame = pack_frame(message.message_id, ALICE, data, message.tag)
    within = within and len(mid) <= limits.MESSAGE_ID_CHARS
    return Hostile(frame, mid, within, must_take and within)


def consumed_ids(node: MockNode) -> set[str]:
    table = schema.node_message_ids
    with node.node.database.engine.connect() as connection:  # type: ignore[union-attr]
        return set(connection.execute(select(table.c.message_id)).scalars())


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
def test_maximal_and_over_limit_fields_never_stop_the_node(
    backend: str, data: st.DataObject
) -> None:
    with MockNetwork(cordapps=["samples.pingpong"], database=backend) as net:
        alice, bob = net.create_node(ALICE), net.create_node(BOB)
        kinds = st.one_of(forged(), genuine_sessions(alice))
        inputs = [
            item for batch in data.draw(st.lists(kinds, min_size=1, max_size=5)) for item in batch
        ]
        for item in inputs:
            net.messaging.inject_raw(BOB, item.frame)
        net.run_network()
        # Bob keeps serving: a ping/pong between the two longest names completes.
        handle = alice.start_flow(PingFlow(bob.party))
        net.run_network()
        assert handle.result() == "Pong"
        assert net.messaging.in_flight(BOB) == 0 and net.messaging.pending(BOB) == 0
        consumed = consumed_ids(bob)
        for item in inputs:
            if item.genuine:
                assert item.message_id in consumed, (
                    f"a message within the limits was refused: {item}"
                )
            if not item.within:
                assert item.message_id not in consumed, f"an over-limit message got in: {item}"
        refused = sum(not item.within for item in inputs)
        dead = len(net.messaging.dead_letters) + bob.node.manager.statistics.dead_lettered
        assert dead >= refused


# --- every dead-letter store takes anything --------------------------------------------------

hostile_text = st.text(
    st.characters(codec="utf-8") | st.sampled_from(["\x00", "\ud800", *CHARACTERS]),
    max_size=40,
).flatmap(lambda t: st.sampled_from([t, t * 20, t + "\x00" * 3]))


@pytest.fixture
def node_database(tmp_path: Path, backend: str) -> object:
    if backend == "sqlite":
        database = NodeDatabase(f"sqlite:///{tmp_path / 'node.db'}")
        yield database
        database.close()
        return
    schema_name = f"ff_dead_{uuid.uuid4().hex[:12]}"
    database = NodeDatabase(backend, schema_name=schema_name)
    yield database
    database.close()
    drop_schema(backend, schema_name)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message_id=hostile_text, sender=hostile_text, reason=hostile_text)
def test_writing_a_dead_letter_never_fails_on_content(
    node_database: NodeDatabase, message_id: str, sender: str, reason: str
) -> None:
    inbound = InboundMessage(message_id, sender, b"\x00payload")
    for store in (node_database.checkpoints, InMemoryStore().checkpoints):
        store.dead_letter(inbound, reason * 300, 1.0)
    table = schema.node_dead_letters
    with node_database.engine.connect() as connection:
        row = connection.execute(select(table).order_by(table.c.id.desc()).limit(1)).one()
    assert len(row.message_id) <= limits.MESSAGE_ID_CHARS
    assert len(row.sender) <= limits.PARTY_NAME_CHARS
    assert len(row.reason) <= limits.DEAD_LETTER_REASON_CHARS
    assert row.payload == b"\x00payload"
    if len(message_id) <= limits.MESSAGE_ID_CHARS and "\x00" not in message_id:
        if "\ud800" not in message_id:
            assert row.message_id == message_id
    else:
        assert DIGEST_MARK in row.message_id


@pytest.fixture
def queue_broker(tmp_path: Path, backend: str) -> object:
    url = f"sqlite:///{tmp_path / 'queue.db'}" if backend == "sqlite" else backend
    broker = SqlQueueBroker(url)
    yield broker
    broker.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message_id=hostile_text, reason=hostile_text)
def test_the_sql_queue_dead_letters_anything(
    queue_broker: SqlQueueBroker, message_id: str, reason: str
) -> None:
    queue = f"O=Dead {uuid.uuid4().hex[:10]},L=Test,C=GB"
    queue_broker.create_queue(queue)
    try:
        queue_broker.insert_raw(queue, b"\x00frame")
        (row_id, _), *_ = queue_broker.claim(queue, "me", 10, 60.0).rows
        queue_broker.dead_letter(queue, row_id, b"\x00frame", reason * 300, message_id * 30)
        assert queue_broker.depth(queue) == 0
        ((size, stored),) = queue_broker.dead_letter_summaries(queue)
        assert size == 6 and len(stored) <= limits.DEAD_LETTER_REASON_CHARS
        table = queue_dead_letters
        with queue_broker.engine.connect() as connection:
            kept = connection.execute(
                select(table.c.message_id).where(table.c.queue == queue)
            ).scalar_one()
        assert len(kept) <= limits.QUEUE_MESSAGE_ID_CHARS
    finally:
        queue_broker.purge(queue)
