"""Session messages to bytes and back, for the wire and the outbox."""

from __future__ import annotations

from persistence.serialization import SerializationError, Serializer, TypeRegistry
from statemachine import flow_error, session_messages
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


def encode_session_message(message: SessionMessage) -> bytes:
    """The bytes a session message travels as."""
    return _SERIALIZER.encode(message)


def decode_session_message(data: bytes) -> SessionMessage:
    """Parse bytes from the wire; raises SerializationError if they are not a session message."""
    decoded = _SERIALIZER.decode(data)
    if not isinstance(decoded, (InitialSessionMessage, ExistingSessionMessage)):
        raise SerializationError(f"not a session message: {type(decoded).__name__}")
    return decoded
