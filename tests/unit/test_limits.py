"""One place defines every inbound limit; the schema, the decoders and ``Party`` agree with it.

Each column that stores something from outside is exactly as wide as its limit in
``statemachine.limits``; each decoder takes a field of exactly its limit and refuses one
character more (characters, not bytes: two-byte characters are used throughout); the ids
fiberflow generates always fit; bounded copies for dead letters always fit their columns.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import String, inspect

from flows import FlowLogic, Party, initiating_flow
from flows.errors import FlowDefinitionError
from flows.node.client import NodeClient
from foundation.bounded import DIGEST_MARK, bounded_reason, bounded_text
from foundation.engine import drop_schema
from foundation.serialization import SerializationError
from messaging import codec
from messaging.codec import TEXT_LIMITS, decode_session_message, encode_session_message
from messaging.frame import (
    FIELD_LIMITS,
    FRAME_VERSION,
    MalformedFrameError,
    decode_frame,
    encode_frame,
)
from messaging.service import SESSION_TOPIC, Message
from messaging.sqlqueue import metadata as queue_metadata
from persistence import schema
from persistence.store import NodeDatabase
from samples.pingpong import PingFlow
from statemachine import limits
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.session_ids import (
    RESPONDER_SUFFIX,
    identity_tag,
    initiator_session_id,
    message_id,
    responder_session_id,
)
from statemachine.session_messages import (
    ConfirmSession,
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionEnd,
    SessionErrorBody,
    SessionReject,
)

WIDE = "\u00e9"  # two bytes in UTF-8, one character

INBOUND_COLUMNS = {
    ("node_checkpoints", "flow_id"): limits.FLOW_ID_CHARS,
    ("node_checkpoints", "flow_class"): limits.FLOW_CLASS_CHARS,
    ("node_checkpoint_blobs", "flow_id"): limits.FLOW_ID_CHARS,
    ("node_flow_results", "flow_id"): limits.FLOW_ID_CHARS,
    ("node_flow_results", "flow_class"): limits.FLOW_CLASS_CHARS,
    ("node_flow_exceptions", "flow_id"): limits.FLOW_ID_CHARS,
    ("node_flow_exceptions", "flow_class"): limits.FLOW_CLASS_CHARS,
    ("node_flow_exceptions", "exception_class"): limits.EXCEPTION_CLASS_CHARS,
    ("node_message_ids", "message_id"): limits.MESSAGE_ID_CHARS,
    ("node_message_ids", "sender"): limits.PARTY_NAME_CHARS,
    ("node_message_ids", "session_id"): limits.SESSION_ID_CHARS,
    ("node_outbox", "message_id"): limits.MESSAGE_ID_CHARS,
    ("node_outbox", "target"): limits.PARTY_NAME_CHARS,
    ("node_dead_letters", "message_id"): limits.MESSAGE_ID_CHARS,
    ("node_dead_letters", "sender"): limits.PARTY_NAME_CHARS,
    ("node_flow_requests", "request_id"): limits.FLOW_ID_CHARS,
    ("node_flow_requests", "flow_class"): limits.FLOW_CLASS_CHARS,
    ("node_schedules", "flow_class"): limits.FLOW_CLASS_CHARS,
    ("node_operator_requests", "flow_id"): limits.FLOW_ID_CHARS,
    ("node_paused_flows", "flow_id"): limits.FLOW_ID_CHARS,
    ("node_running_flows", "flow_id"): limits.FLOW_ID_CHARS,
    ("ff_queues", "name"): limits.QUEUE_NAME_CHARS,
    ("ff_queue_messages", "queue"): limits.QUEUE_NAME_CHARS,
    ("ff_queue_messages", "message_id"): limits.QUEUE_MESSAGE_ID_CHARS,
    ("ff_queue_dead_letters", "queue"): limits.QUEUE_NAME_CHARS,
    ("ff_queue_dead_letters", "message_id"): limits.QUEUE_MESSAGE_ID_CHARS,
}
"""Every bounded text column that can hold data from outside the node, and its limit."""

LOCAL_COLUMNS = {
    ("node_checkpoints", "status"),
    ("node_checkpoints", "suspended_on"),
    ("node_flow_exceptions", "error_kind"),
    ("node_operator_requests", "request_id"),
    ("node_operator_requests", "action"),
    ("node_settings", "name"),
    ("node_schedules", "kind"),  # fixed vocabularies, checked where a schedule is made
    ("node_schedules", "missed"),
    ("ff_queue_messages", "lease_owner"),
    ("node_workers", "worker_id"),  # the node lease: the node's own process facts
    ("node_workers", "host"),
    ("node_workers", "boot_id"),
    ("node_partitions", "holder"),
}
"""Bounded text columns only the node itself writes (fixed vocabularies, its own uuids)."""

LOCAL_LIMITED_COLUMNS = {
    ("node_checkpoints", "progress_step"): limits.PROGRESS_STEP_CHARS,
    ("node_schedules", "schedule_id"): limits.SCHEDULE_ID_CHARS,
    ("node_schedules", "spec"): limits.SCHEDULE_SPEC_CHARS,
    ("node_workers", "name"): limits.WORKER_NAME_CHARS,
}
"""Columns the node's own flows (or its operators' commands) write, bounded by a limit checked
where they are set."""


def bounded_columns() -> dict[tuple[str, str], int]:
    found = {}
    for metadata in (schema.metadata, queue_metadata):
        for table in metadata.tables.values():
            for column in table.columns:
                if isinstance(column.type, String) and column.type.length is not None:
                    found[(table.name, column.name)] = column.type.length
    return found


def test_every_column_that_stores_inbound_data_is_exactly_as_wide_as_its_limit() -> None:
    columns = bounded_columns()
    checked = {**INBOUND_COLUMNS, **LOCAL_LIMITED_COLUMNS}
    unclassified = set(columns) - set(checked) - LOCAL_COLUMNS
    assert not unclassified, f"say whether these hold inbound data: {sorted(unclassified)}"
    assert not set(checked) & LOCAL_COLUMNS
    assert set(checked) <= set(columns), "a listed column no longer exists"
    wrong = {key: (columns[key], limit) for key, limit in checked.items()}
    assert {k: v for k, v in wrong.items() if v[0] != v[1]} == {}


def test_the_created_tables_have_the_limits_widths(tmp_path: Path, backend: str) -> None:
    if backend == "sqlite":
        database = NodeDatabase(f"sqlite:///{tmp_path / 'node.db'}")
        schema_name = None
    else:
        schema_name = f"ff_limits_{uuid.uuid4().hex[:12]}"
        database = NodeDatabase(backend, schema_name=schema_name)
    try:
        inspector = inspect(database.engine)
        for (table, column), limit in INBOUND_COLUMNS.items():
            if table.startswith("ff_"):
                continue
            (found,) = [c for c in inspector.get_columns(table, schema_name) if c["name"] == column]
            assert found["type"].length == limit, (table, column)
    finally:
        database.close()
        if schema_name is not None:
            drop_schema(backend, schema_name)


# --- the frame decoder ------------------------------------------------------------------------


def frame_message(**fields: str) -> Message:
    base = {"message_id": "N-x.s0-1", "topic": SESSION_TOPIC, "sender": "O=A,L=B,C=GB"}
    base.update(fields)
    return Message(base["message_id"], base["topic"], base["sender"], b"data")


def loose_frame(message: Message) -> bytes:
    import msgpack

    fields = [FRAME_VERSION, message.message_id, message.topic, message.sender, message.data, b""]
    return bytes(msgpack.packb(fields, use_bin_type=True))


@pytest.mark.parametrize("field", sorted(FIELD_LIMITS))
def test_the_frame_decoder_takes_exactly_the_limit_and_refuses_one_more(field: str) -> None:
    limit = FIELD_LIMITS[field]
    assert (
        limit
        == {
            "message_id": limits.MESSAGE_ID_CHARS,
            "topic": limits.TOPIC_CHARS,
            "sender": limits.PARTY_NAME_CHARS,
        }[field]
    )
    at_limit = frame_message(**{field: WIDE * limit})
    assert decode_frame(encode_frame(at_limit)) == at_limit
    over = frame_message(**{field: WIDE * (limit + 1)})
    expected = f"field {field} has {limit + 1} characters; the limit is {limit}"
    with pytest.raises(MalformedFrameError, match=expected):
        decode_frame(loose_frame(over))
    with pytest.raises(MalformedFrameError, match=expected):  # the sender is told too
        encode_frame(over)
    with pytest.raises(MalformedFrameError, match=f"field {field} contains a NUL character"):
        decode_frame(loose_frame(frame_message(**{field: "a\x00b"})))
    with pytest.raises(MalformedFrameError, match=f"field {field} is empty"):
        decode_frame(loose_frame(frame_message(**{field: ""})))


def test_a_frame_over_the_size_limit_is_refused_on_its_length() -> None:
    with pytest.raises(MalformedFrameError, match="frame of 11 bytes exceeds the limit of 10"):
        decode_frame(b"\xc1" * 11, max_bytes=10)
    assert limits.FRAME_BYTES == 16 * 1024 * 1024


# --- the session-message decoder --------------------------------------------------------------


def _with(value: Any, field: str, text: str) -> Any:
    """``value`` with ``field`` set to ``text``, bypassing converters (FlowError cuts messages)."""
    copy = attrs.evolve(value)
    object.__setattr__(copy, field, text)
    return copy


def carrying(cls: type, field: str, text: str) -> Any:
    """A session message whose ``cls`` part has ``field`` set to ``text``."""
    initial = InitialSessionMessage("abc.s0", "samples.pingpong.flows.PingFlow", 1, "app", None)
    if cls is InitialSessionMessage:
        return _with(initial, field, text)
    if cls is ExistingSessionMessage:
        return _with(ExistingSessionMessage("abc.s0.r", 1, SessionEnd()), field, text)
    if cls is ConfirmSession:
        body: Any = _with(ConfirmSession(1, "app"), field, text)
    elif cls is SessionReject:
        body = _with(SessionReject("no"), field, text)
    else:
        assert cls is FlowError
        error = _with(FlowError(ErrorKind.FLOW_EXCEPTION, "a.B", "message", "E-1"), field, text)
        body = SessionErrorBody(error)
    return ExistingSessionMessage("abc.s0.r", 1, body)


def test_every_text_field_on_the_wire_has_a_limit() -> None:
    text_fields = {
        (cls, name)
        for cls, fields in codec._FIELD_TYPES.items()
        for name, types in fields.items()
        if str in types
    }
    assert text_fields == set(TEXT_LIMITS)
    assert TEXT_LIMITS[(InitialSessionMessage, "initiator_session_id")][0] == (
        limits.INITIATOR_SESSION_ID_CHARS
    )
    assert TEXT_LIMITS[(ExistingSessionMessage, "recipient_session_id")][0] == (
        limits.SESSION_ID_CHARS
    )
    assert TEXT_LIMITS[(InitialSessionMessage, "initiator_flow_class")][0] == (
        limits.FLOW_CLASS_CHARS
    )
    assert TEXT_LIMITS[(SessionReject, "reason")][0] == limits.REJECT_REASON_CHARS


@pytest.mark.parametrize(
    ("cls", "field"), sorted(TEXT_LIMITS, key=lambda key: (key[0].__name__, key[1]))
)
def test_the_session_decoder_takes_exactly_the_limit_and_refuses_one_more(
    cls: type, field: str
) -> None:
    limit, may_be_empty = TEXT_LIMITS[(cls, field)]
    at_limit = carrying(cls, field, WIDE * limit)
    assert decode_session_message(encode_session_message(at_limit)) == at_limit
    over = carrying(cls, field, WIDE * (limit + 1))
    if (cls, field) == (FlowError, "message"):
        # A FlowError cuts its own message to the limit whenever one is made, decoding too.
        decoded = decode_session_message(encode_session_message(over))
        message = decoded.body.error.message
        assert len(message) <= limit and message.endswith("more characters cut)")
        return
    with pytest.raises(
        SerializationError, match=f"field {field} has {limit + 1} characters; the limit is {limit}"
    ):
        decode_session_message(encode_session_message(over))
    with pytest.raises(SerializationError, match=f"field {field} contains a NUL character"):
        decode_session_message(encode_session_message(carrying(cls, field, "a\x00b")))
    empty = encode_session_message(carrying(cls, field, ""))
    if may_be_empty:
        decode_session_message(empty)
    else:
        with pytest.raises(SerializationError, match=f"field {field} is empty"):
            decode_session_message(empty)


def test_sequence_numbers_are_taken_up_to_the_limit() -> None:
    top = ExistingSessionMessage("abc.s0.r", limits.MAX_SEQUENCE, SessionEnd())
    assert decode_session_message(encode_session_message(top)) == top
    over = ExistingSessionMessage("abc.s0.r", limits.MAX_SEQUENCE + 1, SessionEnd())
    with pytest.raises(SerializationError, match="out of range"):
        decode_session_message(encode_session_message(over))


# --- names and generated ids ------------------------------------------------------------------


def test_party_names_are_bounded() -> None:
    head = "O=Alice,L=London,C=GB,CN="
    name = head + WIDE * (limits.PARTY_NAME_CHARS - len(head))
    assert Party(name).name == name
    with pytest.raises(ValueError, match=f"the limit is {limits.PARTY_NAME_CHARS}"):
        Party(name + "x")
    with pytest.raises(ValueError, match="NUL"):
        Party("O=Al\x00ice,L=London,C=GB")


def test_the_ids_fiberflow_generates_always_fit() -> None:
    assert limits.INITIATOR_SESSION_ID_CHARS + len(RESPONDER_SUFFIX) == limits.SESSION_ID_CHARS
    tag = identity_tag("O=Alice,L=London,C=GB")
    flow_id = "f" * limits.FLOW_ID_CHARS
    longest = initiator_session_id(flow_id, 10**35 - 1, tag)
    assert len(longest) <= limits.INITIATOR_SESSION_ID_CHARS
    assert len(responder_session_id(longest)) <= limits.SESSION_ID_CHARS
    assert len(message_id(responder_session_id(longest), limits.MAX_SEQUENCE)) <= (
        limits.MESSAGE_ID_CHARS
    )
    # Every received id is checked against one generated from a session id within the limit.
    for session in ("s" * limits.SESSION_ID_CHARS, "s" * limits.INITIATOR_SESSION_ID_CHARS):
        assert len(message_id(session + RESPONDER_SUFFIX, limits.MAX_SEQUENCE)) <= (
            limits.MESSAGE_ID_CHARS
        )


def test_a_flow_class_whose_name_does_not_fit_is_refused_when_declared() -> None:
    name = "F" * (limits.FLOW_CLASS_CHARS - len(__name__))  # one over, with the dot
    cls = type(name, (FlowLogic,), {"call": lambda self: None, "__module__": __name__})
    with pytest.raises(FlowDefinitionError, match=f"the limit is {limits.FLOW_CLASS_CHARS}"):
        initiating_flow(cls)
    fits = type(name[:-1], (FlowLogic,), {"call": lambda self: None, "__module__": __name__})
    assert initiating_flow(fits) is fits


def test_a_client_request_id_must_fit_a_flow_id(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'node.db'}"
    NodeDatabase(url).close()  # made as a node makes it (a client only opens one)
    client = NodeClient(url)
    flow = PingFlow(Party("O=Bob,L=New York,C=US"))
    with pytest.raises(ValueError, match=f"1 to {limits.FLOW_ID_CHARS} characters"):
        client.start_flow(flow, "r" * (limits.FLOW_ID_CHARS + 1))
    assert client.start_flow(flow, "r" * limits.FLOW_ID_CHARS) == "r" * limits.FLOW_ID_CHARS
    client.database.close()


# --- bounded copies ---------------------------------------------------------------------------

hostile_text = st.text(
    st.characters(codec="utf-8") | st.sampled_from(["\x00", "\ud800", WIDE, "\U0001d11e"]),
    max_size=400,
)


def storable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@settings(max_examples=300, deadline=None)
@given(hostile_text, hostile_text, st.integers(21, 300))
def test_bounded_copies_fit_are_storable_and_keep_values_apart(
    first: str, second: str, limit: int
) -> None:
    one, two = bounded_text(first, limit), bounded_text(second, limit)
    for original, copy in ((first, one), (second, two)):
        assert len(copy) <= limit and storable(copy)
        if len(original) <= limit and storable(original):
            assert copy == original
        else:
            assert DIGEST_MARK in copy
    if first != second and DIGEST_MARK in one and DIGEST_MARK in two:
        assert one != two


def test_a_reason_is_cut_to_its_bound() -> None:
    reason = bounded_reason("r" * 100_000)
    assert len(reason) == limits.DEAD_LETTER_REASON_CHARS and DIGEST_MARK in reason
