"""Session messages to bytes and back, for the wire and the outbox."""

from __future__ import annotations

import attrs

from messaging.frame import MAX_FRAME_BYTES, text_problem
from persistence.serialization import (
    SerializationError,
    SerializationLimits,
    Serializer,
    TypeRegistry,
)
from statemachine import flow_error, session_messages
from statemachine.limits import (
    APP_NAME_CHARS,
    ERROR_ID_CHARS,
    ERROR_MESSAGE_CHARS,
    EXCEPTION_CLASS_CHARS,
    FLOW_CLASS_CHARS,
    INITIATOR_SESSION_ID_CHARS,
    MAX_SEQUENCE,
    REJECT_REASON_CHARS,
    SESSION_ID_CHARS,
)
from statemachine.session_messages import (
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionMessage,
)

WIRE_TYPES = TypeRegistry(
    [
        session_messages.InitialSessionMessage,
        session_messages.ExistingSessionMessage,
        session_messages.ConfirmSession,
        session_messages.SessionData,
        session_messages.SessionEnd,
        session_messages.SessionErrorBody,
        session_messages.SessionReject,
        flow_error.FlowError,
        flow_error.ErrorKind,
    ]
)

_SERIALIZER = Serializer(WIRE_TYPES, "session message")


ENVELOPE_HEADROOM = 64 * 1024
"""Bytes kept free, beside a payload, for its session message and frame (ids, names, a
signature): a payload that fits under the limits less this always fits on the wire."""


def configure_wire_limits(limits: SerializationLimits) -> None:
    """Set the limits inbound and outbound session messages are checked against."""
    problem = wire_limits_problem(limits)
    if problem is not None:
        raise ValueError(problem)
    _SERIALIZER.limits = limits


def wire_limits_problem(limits: SerializationLimits) -> str | None:
    """Why ``limits`` leave no room for a session message's envelope, or None if they do."""
    smallest = 2 * ENVELOPE_HEADROOM
    for name in ("max_bytes", "max_bytes_length"):
        value = getattr(limits, name)
        if value < smallest:
            return (
                f"limits.{name} is {value}: session messages need at least {smallest} bytes "
                f"(a payload plus {ENVELOPE_HEADROOM} for the envelope)"
            )
    return None


def max_payload_bytes() -> int:
    """The largest payload a flow may send: it fits in a session message and in a frame."""
    limits = _SERIALIZER.limits
    return min(limits.max_bytes, limits.max_bytes_length, MAX_FRAME_BYTES) - ENVELOPE_HEADROOM


def encode_session_message(message: SessionMessage) -> bytes:
    """The bytes a session message travels as."""
    return _SERIALIZER.encode(message)


_FIELD_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    InitialSessionMessage: {
        "initiator_session_id": (str,),
        "initiator_flow_class": (str,),
        "flow_version": (int,),
        "app_name": (str,),
        "first_payload": (bytes, type(None)),
    },
    ExistingSessionMessage: {
        "recipient_session_id": (str,),
        "sequence": (int,),
        "body": (
            session_messages.ConfirmSession,
            session_messages.SessionData,
            session_messages.SessionEnd,
            session_messages.SessionErrorBody,
            session_messages.SessionReject,
        ),
    },
    session_messages.ConfirmSession: {"flow_version": (int,), "app_name": (str,)},
    session_messages.SessionData: {"payload": (bytes,)},
    session_messages.SessionEnd: {},
    session_messages.SessionErrorBody: {"error": (flow_error.FlowError,)},
    session_messages.SessionReject: {"reason": (str,)},
    flow_error.FlowError: {
        "kind": (flow_error.ErrorKind,),
        "exception_class": (str,),
        "message": (str,),
        "error_id": (str,),
    },
}

TEXT_LIMITS: dict[tuple[type, str], tuple[int, bool]] = {
    (InitialSessionMessage, "initiator_session_id"): (INITIATOR_SESSION_ID_CHARS, False),
    (InitialSessionMessage, "initiator_flow_class"): (FLOW_CLASS_CHARS, False),
    (InitialSessionMessage, "app_name"): (APP_NAME_CHARS, True),
    (ExistingSessionMessage, "recipient_session_id"): (SESSION_ID_CHARS, False),
    (session_messages.ConfirmSession, "app_name"): (APP_NAME_CHARS, True),
    (session_messages.SessionReject, "reason"): (REJECT_REASON_CHARS, True),
    (flow_error.FlowError, "exception_class"): (EXCEPTION_CLASS_CHARS, True),
    (flow_error.FlowError, "message"): (ERROR_MESSAGE_CHARS, True),
    (flow_error.FlowError, "error_id"): (ERROR_ID_CHARS, True),
}
"""(class, field) -> (longest length, whether it may be empty) of every text field on the wire
(limits from :mod:`statemachine.limits`). A longer ``FlowError.message`` never reaches the
check: a ``FlowError`` cuts its message to the limit when it is made, decoding included."""


def _check_fields(value: object, path: str) -> None:
    expected = _FIELD_TYPES.get(type(value))
    if expected is None:
        raise SerializationError(f"{path} is a {type(value).__name__}, not a session message part")
    for field in attrs.fields(type(value)):  # type: ignore[arg-type]
        item = getattr(value, field.name)
        allowed = expected[field.name]
        if isinstance(item, bool) or not isinstance(item, allowed):
            names = " or ".join(t.__name__ for t in allowed)
            raise SerializationError(
                f"{path}.{field.name} must be {names}, not {type(item).__name__}"
            )
        if isinstance(item, str):
            limit, may_be_empty = TEXT_LIMITS[(type(value), field.name)]
            problem = text_problem(field.name, item, limit, may_be_empty=may_be_empty)
            if problem is not None:
                raise SerializationError(f"{path}: {problem}")
        if type(item) in _FIELD_TYPES:
            _check_fields(item, f"{path}.{field.name}")


def decode_session_message(data: bytes) -> SessionMessage:
    """Parse bytes from the wire; raises SerializationError naming what is wrong with them.

    Beyond decoding with the allow-list, every field must have its declared type, every text
    field must be within its limit (``TEXT_LIMITS``; ids and class names non-empty) and hold
    no NUL character, and a sequence number must be in ``0..MAX_SEQUENCE`` (each side of a
    session counts its own messages from 0).
    """
    decoded = _SERIALIZER.decode(data)
    if not isinstance(decoded, (InitialSessionMessage, ExistingSessionMessage)):
        raise SerializationError(f"not a session message: {type(decoded).__name__}")
    _check_fields(decoded, type(decoded).__name__)
    if isinstance(decoded, ExistingSessionMessage) and not 0 <= decoded.sequence <= MAX_SEQUENCE:
        raise SerializationError(
            f"sequence number {decoded.sequence} is out of range 0..{MAX_SEQUENCE}"
        )
    return decoded
