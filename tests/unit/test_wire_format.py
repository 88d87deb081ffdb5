"""The compact wire form of session messages: every kind round-trips, the first format is still
read, and each kind of broken input is refused naming what is wrong."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.serialization import SerializationError, Serializer
from messaging.codec import WIRE_TYPES, SessionCodec
from messaging.wire_format import WIRE_FORMAT, is_wire_format, pack_message
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.session_messages import (
    ConfirmSession,
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionData,
    SessionEnd,
    SessionErrorBody,
    SessionReject,
)

CODEC = SessionCodec()
FIRST_FORMAT = Serializer(WIRE_TYPES, "session message")

MESSAGES = [
    InitialSessionMessage("abc.s0", "samples.pingpong.PingFlow", 1, "samples", b"ping"),
    InitialSessionMessage("abc.s0", "samples.pingpong.PingFlow", 2, "", None),
    ExistingSessionMessage("abc.s0.r", 0, ConfirmSession(1, "samples")),
    ExistingSessionMessage("abc.s0", 7, SessionData(b"\x00payload")),
    ExistingSessionMessage("abc.s0", 8, SessionEnd()),
    ExistingSessionMessage(
        "abc.s0", 9, SessionErrorBody(FlowError(ErrorKind.FLOW_EXCEPTION, "a.B", "no", "e1"))
    ),
    ExistingSessionMessage("abc.s0.r", 0, SessionReject("no responder")),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(getattr(m, "body", m)).__name__)
def test_every_kind_of_message_round_trips_in_the_wire_format(message: object) -> None:
    data = CODEC.encode(message)  # type: ignore[arg-type]
    assert is_wire_format(data)
    assert msgpack.unpackb(data)[0] == WIRE_FORMAT
    assert CODEC.decode(data) == message


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(getattr(m, "body", m)).__name__)
def test_a_message_of_the_first_format_is_still_read(message: object) -> None:
    data = FIRST_FORMAT.encode(message)  # an outbox row written before the upgrade
    assert not is_wire_format(data)
    assert CODEC.decode(data) == message


def wire(*items: object) -> bytes:
    return msgpack.packb([WIRE_FORMAT, *items], use_bin_type=True)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (wire(99, "x"), "unknown tag 99"),
        (wire(True, "x"), "unknown tag True"),
        (wire(), "not in wire format 2"),
        (wire(1, "abc.s0", 1), "ExistingSessionMessage has 3 fields, not 2"),
        (wire(1, "abc.s0", 1, [4, "extra"]), "SessionEnd has 0 fields, not 1"),
        (wire(1, "abc.s0", 1, [5, [7, "nope", "a", "m", ""]]), "FlowError.kind is 'nope'"),
        (wire(1, "abc.s0", 1, [5, [5, [5, [5, []]]]]), "nested too deep"),
        (wire(1, "abc.s0", 1, {"a": 1}), "exceeds max_map_len"),
        (wire(*range(20)), "exceeds max_array_len"),
        (msgpack.packb([WIRE_FORMAT, msgpack.ExtType(2, b"x")]), "exceeds max_ext_len"),
        (wire(1, "abc.s0", "one", [4]), "sequence must be int, not str"),
        (wire(1, "abc.s0", 1, [3, "text"]), "payload must be bytes, not str"),
        (wire(1, "abc.s0", 1, [0, "a", "b", 1, "", None]), "body must be"),
        (wire(1, "abc.s0", -1, [4]), "out of range"),
        (wire(1, "", 1, [4]), "recipient_session_id is empty"),
        (wire(2, 1, "app"), "not a session message: ConfirmSession"),
    ],
)
def test_each_broken_message_is_refused_naming_what_is_wrong(data: bytes, reason: str) -> None:
    with pytest.raises(SerializationError, match=reason.replace("(", r"\(")):
        CODEC.decode(data)


@given(
    st.lists(
        st.none()
        | st.booleans()
        | st.integers()
        | st.text(max_size=5)
        | st.binary(max_size=5)
        | st.lists(st.integers(0, 9) | st.text(max_size=3), max_size=6),
        max_size=8,
    )
)
def test_anything_claiming_the_wire_format_decodes_or_is_refused(items: list[object]) -> None:
    try:
        data = msgpack.packb([WIRE_FORMAT, *items], use_bin_type=True)
    except (OverflowError, ValueError):
        return  # msgpack cannot pack it: no peer could send it either
    with contextlib.suppress(SerializationError):  # refused with a reason: fine
        CODEC.decode(data)


def test_a_packed_message_over_the_byte_limit_is_refused_when_encoding() -> None:
    big = ExistingSessionMessage("abc.s0", 1, SessionData(b"x" * (CODEC.limits.max_bytes + 1)))
    with pytest.raises(SerializationError, match="over the limit max_bytes"):
        CODEC.encode(big)
    assert pack_message(big)  # the packing itself never checks: tests build bad messages
