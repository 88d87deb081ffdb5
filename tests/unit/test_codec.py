"""The session codec is a value made per node, and message classes carry their own field rules.

(The limits themselves, at and one past every edge, are in ``tests/unit/test_limits.py``.)
"""

from __future__ import annotations

from typing import Annotated

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.serialization import PAYLOADS, SerializationError, SerializationLimits
from messaging.codec import ENVELOPE_HEADROOM, SessionCodec
from statemachine import limits
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.session_messages import (
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionEnd,
    SessionErrorBody,
)
from statemachine.wire_fields import InvalidFieldError, Text, WirePart, field_rules
from tests.malformed import anything, bodies, sequences, session_ids

SMALL = SerializationLimits(max_bytes=2 * ENVELOPE_HEADROOM, max_bytes_length=3 * ENVELOPE_HEADROOM)


def test_a_codec_is_made_from_limits_and_never_changes() -> None:
    codec = SessionCodec(SMALL)
    assert codec.max_payload_bytes == 2 * ENVELOPE_HEADROOM - ENVELOPE_HEADROOM
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        codec.limits = SerializationLimits()  # type: ignore[misc]
    assert SessionCodec().max_payload_bytes == limits.FRAME_BYTES - ENVELOPE_HEADROOM
    message = ExistingSessionMessage("abc.s0.r", 3, SessionEnd())
    assert codec.decode(codec.encode(message)) == message


def test_limits_without_room_for_the_envelope_make_no_codec() -> None:
    with pytest.raises(ValueError, match="session messages need at least"):
        SessionCodec(SerializationLimits(max_bytes=ENVELOPE_HEADROOM))


def test_a_serializer_s_limits_are_fixed_and_a_node_gets_its_own() -> None:
    with pytest.raises(AttributeError):
        PAYLOADS.limits = SMALL  # type: ignore[misc]
    mine = PAYLOADS.with_limits(SMALL)
    assert mine.limits == SMALL and PAYLOADS.limits == SerializationLimits()
    assert mine.registry is PAYLOADS.registry


def test_a_message_validates_itself_naming_the_field() -> None:
    InitialSessionMessage("abc.s0", "a.Flow", 1, "", None).validate()
    with pytest.raises(InvalidFieldError, match="field recipient_session_id is empty"):
        ExistingSessionMessage("", 1, SessionEnd()).validate()
    with pytest.raises(InvalidFieldError, match="ExistingSessionMessage.sequence must be int"):
        ExistingSessionMessage("abc", True, SessionEnd()).validate()
    error = FlowError(ErrorKind.FLOW_EXCEPTION, "x" * (limits.EXCEPTION_CLASS_CHARS + 1), "m")
    with pytest.raises(InvalidFieldError, match=r"ExistingSessionMessage\.body\.error: field"):
        ExistingSessionMessage("abc", 1, SessionErrorBody(error)).validate()


def test_the_codec_reports_a_broken_rule_as_a_serialization_error() -> None:
    codec = SessionCodec()
    data = codec.encode(ExistingSessionMessage("abc", -1, SessionEnd()))
    with pytest.raises(SerializationError, match="field sequence is -1, out of range 0.."):
        codec.decode(data)


def test_text_from_outside_must_declare_its_limit() -> None:
    @attrs.frozen
    class Unbounded(WirePart):
        name: str

    @attrs.frozen
    class Bounded(WirePart):
        name: Annotated[str, Text(10)]

    with pytest.raises(TypeError, match=r"Annotated\[str, Text"):
        field_rules(Unbounded)
    (rule,) = field_rules(Bounded)
    assert rule.types == (str,) and rule.text == Text(10)


@settings(max_examples=400, deadline=None)
@given(
    st.builds(ExistingSessionMessage, session_ids | anything, sequences, bodies)
    | st.builds(InitialSessionMessage, anything, anything, anything, anything, anything)
)
def test_the_compiled_check_agrees_with_the_rules_read_one_by_one(message: WirePart) -> None:
    # validate() runs a check compiled per class and, only when it says no, the rules one
    # by one (which name the broken rule): both must agree on every message.
    from statemachine.wire_fields import _check, _fast_check

    try:
        _check(message, "m")
        valid = True
    except InvalidFieldError:
        valid = False
    assert _fast_check(type(message))(message) is valid
