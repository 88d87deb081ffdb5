"""Session messages to bytes and back, for the wire and the outbox: :class:`SessionCodec`.

A node makes one codec from its serialization limits and hands it to what encodes or decodes
session messages (the state machine manager and its executor); the largest payload a flow may
send (:attr:`SessionCodec.max_payload_bytes`) comes from the same codec. Nothing here changes
after it is made: two nodes in one process may have different limits.

The wire format of each message is declared once, on the message classes
(:mod:`statemachine.session_messages`, :mod:`statemachine.wire_fields`); decoding checks what
a peer sent against it (:meth:`~statemachine.wire_fields.WirePart.validate`).
"""

from __future__ import annotations

import attrs

from foundation.serialization import (
    DEFAULT_LIMITS,
    SerializationError,
    SerializationLimits,
    Serializer,
    TypeRegistry,
)
from messaging.wire_format import is_wire_format, pack_message, unpack_message
from statemachine.limits import ENVELOPE_HEADROOM, FRAME_BYTES
from statemachine.session_messages import (
    WIRE_CLASSES,
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionMessage,
)
from statemachine.wire_fields import InvalidFieldError, WirePart, field_rules

__all__ = [
    "ENVELOPE_HEADROOM",
    "TEXT_LIMITS",
    "WIRE_TYPES",
    "SessionCodec",
    "decode_session_message",
    "encode_session_message",
    "max_payload_bytes",
    "wire_limits_problem",
]

WIRE_TYPES = TypeRegistry(WIRE_CLASSES)
"""The classes a session message may be made of: nothing else is ever constructed."""

_PARTS = [cls for cls in WIRE_CLASSES if issubclass(cls, WirePart)]

_FIELD_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    cls: {rule.name: rule.types for rule in field_rules(cls)} for cls in _PARTS
}
"""(class -> field -> allowed types) of every part, read from the classes' annotations."""

TEXT_LIMITS: dict[tuple[type, str], tuple[int, bool]] = {
    (cls, rule.name): (rule.text.limit, rule.text.may_be_empty)
    for cls in _PARTS
    for rule in field_rules(cls)
    if rule.text is not None
}
"""(class, field) -> (longest length, whether it may be empty) of every text field on the wire,
read from the classes' annotations (limits from :mod:`statemachine.limits`). A longer
``FlowError.message`` never reaches the check: a ``FlowError`` cuts its message to the limit
when it is made, decoding included."""


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


def _checked_limits(limits: SerializationLimits) -> SerializationLimits:
    problem = wire_limits_problem(limits)
    if problem is not None:
        raise ValueError(problem)
    return limits


@attrs.frozen
class SessionCodec:
    """Encodes and decodes session messages within one node's serialization limits.

    Raises ValueError when made with limits that leave no room for a message's envelope
    (:func:`wire_limits_problem`).
    """

    limits: SerializationLimits = attrs.field(default=DEFAULT_LIMITS, converter=_checked_limits)
    """The node's limits: they bound session messages, and (less the envelope) payloads."""
    _serializer: Serializer = attrs.field(init=False, repr=False, eq=False)
    max_payload_bytes: int = attrs.field(init=False)
    """The largest payload a flow may send: it fits in a session message and in a frame."""

    @_serializer.default
    def _make_serializer(self) -> Serializer:
        return Serializer(WIRE_TYPES, "session message", self.limits)

    @max_payload_bytes.default
    def _payload_limit(self) -> int:
        limits = self.limits
        fits = min(limits.max_bytes, limits.max_bytes_length, FRAME_BYTES)
        return fits - ENVELOPE_HEADROOM

    def encode(self, message: SessionMessage) -> bytes:
        """The bytes a session message travels as (:mod:`messaging.wire_format`)."""
        data = pack_message(message)
        if len(data) > self.limits.max_bytes:
            raise SerializationError(
                f"cannot serialize session message: {len(data)} bytes encoded, over the "
                f"limit max_bytes ({self.limits.max_bytes})"
            )
        return data

    def decode(self, data: bytes) -> SessionMessage:
        """Parse bytes from the wire; raises SerializationError naming what is wrong with them.

        Messages in the wire format (:mod:`messaging.wire_format`) are read by position;
        messages of the first format (written before it, say in an outbox) with the
        allow-list serializer. Either way the message must then satisfy its class's field
        rules (:meth:`~statemachine.wire_fields.WirePart.validate`): every field of its
        declared type, every text field within its limit (ids and class names non-empty)
        without a NUL character, the sequence number in ``0..MAX_SEQUENCE``.
        """
        if not isinstance(data, bytes):
            raise SerializationError("cannot deserialize session message: not bytes")
        if len(data) > self.limits.max_bytes:
            raise SerializationError(
                f"cannot deserialize session message: {len(data)} bytes received, over the "
                f"limit max_bytes ({self.limits.max_bytes})"
            )
        if is_wire_format(data):
            decoded = unpack_message(data, self.limits)
        else:
            decoded = self._serializer.decode(data)
        if not isinstance(decoded, (InitialSessionMessage, ExistingSessionMessage)):
            raise SerializationError(f"not a session message: {type(decoded).__name__}")
        try:
            decoded.validate()
        except InvalidFieldError as error:
            raise SerializationError(str(error)) from None
        return decoded


_DEFAULT = SessionCodec()


def encode_session_message(message: SessionMessage) -> bytes:
    """:meth:`SessionCodec.encode` within the default limits (tools and tests)."""
    return _DEFAULT.encode(message)


def decode_session_message(data: bytes) -> SessionMessage:
    """:meth:`SessionCodec.decode` within the default limits (tools and tests)."""
    return _DEFAULT.decode(data)


def max_payload_bytes() -> int:
    """:attr:`SessionCodec.max_payload_bytes` of a node with the default limits."""
    return _DEFAULT.max_payload_bytes
