"""The compact wire form of session messages: nested msgpack arrays by position, one pack.

A session message and its parts (bodies, :class:`~statemachine.flow_error.FlowError`) travel
as arrays ``[tag, field, field, ...]`` in the order of the class's attrs fields, a part held
in a field as an array of its own, an enum member as its value. The whole message is packed
and unpacked by msgpack in one call each, with no extension types: no Python code runs per
nested object while packing, and decoding walks a handful of short lists. The message is
prefixed by :data:`WIRE_FORMAT`, so a reader tells it from the first format (the generic
allow-list serializer, :mod:`foundation.serialization`), which the codec still reads: an
outbox written before an upgrade is still delivered.

The tags are the positions of the classes in :data:`TAGGED`: fixed, part of the format.
Decoding builds only those classes, and only from arrays of exactly their field count; the
field rules (types, text limits, ranges) are checked afterwards by the message's
``validate()`` (:mod:`statemachine.wire_fields`), as for the first format.
"""

from __future__ import annotations

import enum
from typing import Any

import attrs
import msgpack

from foundation.serialization import SerializationError, SerializationLimits
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.session_messages import (
    ConfirmSession,
    ExistingSessionMessage,
    InitialSessionMessage,
    SessionData,
    SessionEnd,
    SessionErrorBody,
    SessionMessage,
    SessionReject,
)

__all__ = ["TAGGED", "WIRE_FORMAT", "is_wire_format", "pack_message", "unpack_message"]

WIRE_FORMAT = 2
"""The first element of every message in this form (the generic serializer was format 1)."""

TAGGED: tuple[type, ...] = (
    InitialSessionMessage,
    ExistingSessionMessage,
    ConfirmSession,
    SessionData,
    SessionEnd,
    SessionErrorBody,
    SessionReject,
    FlowError,
)
"""The classes a message is made of; a class's tag is its position here (never reorder)."""

ENUMS: dict[tuple[type, str], type[enum.Enum]] = {(FlowError, "kind"): ErrorKind}
"""Fields holding an enum member, sent as the member's value."""

_TAGS = {cls: tag for tag, cls in enumerate(TAGGED)}
_FIELDS = {cls: tuple(field.name for field in attrs.fields(cls)) for cls in TAGGED}
_MAX_ITEMS = 2 + max(len(names) for names in _FIELDS.values())
"""The longest array a message holds (the outer one: format, tag, fields)."""


def _plain(value: Any) -> Any:
    """``value`` as it travels: a tagged part as its array, an enum member as its value."""
    tag = _TAGS.get(type(value))
    if tag is not None:
        return [tag, *(_plain(getattr(value, name)) for name in _FIELDS[type(value)])]
    if isinstance(value, enum.Enum):
        return value.value
    return value


def pack_message(message: SessionMessage) -> bytes:
    """The bytes of ``message`` (packed whatever its fields hold: tests build bad ones)."""
    body = _plain(message)
    packed: bytes = msgpack.packb([WIRE_FORMAT, *body], use_bin_type=True)
    return packed


def is_wire_format(data: bytes) -> bool:
    """True if ``data`` starts like a message in this form.

    That is an array whose first item is :data:`WIRE_FORMAT`; a message of the first format
    starts with an extension type.
    """
    if not data:
        return False
    first = 1 if 0x90 <= data[0] <= 0x9F else {0xDC: 3, 0xDD: 5}.get(data[0])  # array headers
    return first is not None and len(data) > first and data[first] == WIRE_FORMAT


def _reject(_code: int, _data: bytes) -> None:
    raise SerializationError("cannot deserialize session message: no extension types here")


def unpack_message(data: bytes, limits: SerializationLimits) -> object:
    """The message (or part) in ``data``, built from its tagged arrays; not validated yet.

    Raises :class:`SerializationError` naming what is wrong: undecodable bytes, a value over a
    limit, an unknown tag, an array of the wrong length, an unknown enum value.
    """
    try:
        items = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            ext_hook=_reject,
            max_str_len=limits.max_string_length * 4,  # UTF-8 takes up to 4 bytes a character
            max_bin_len=limits.max_bytes_length,
            max_array_len=_MAX_ITEMS,
            max_map_len=0,
            max_ext_len=0,
        )
    except SerializationError:
        raise
    except Exception as error:  # msgpack raises several unrelated exception types
        raise SerializationError(f"cannot deserialize session message: {error}") from error
    if not isinstance(items, list) or len(items) < 2 or items[0] != WIRE_FORMAT:
        raise SerializationError("cannot deserialize session message: not in wire format 2")
    return _build(items[1:], depth=0)


def _build(items: Any, depth: int) -> Any:
    """The tagged part ``items`` describes (``[tag, fields...]``), with its parts built."""
    if depth > 3:  # a message holds at most: message > body > error
        raise SerializationError("cannot deserialize session message: nested too deep")
    tag = items[0] if items else None
    if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag < len(TAGGED):
        raise SerializationError(f"cannot deserialize session message: unknown tag {tag!r}")
    cls = TAGGED[tag]
    names = _FIELDS[cls]
    if len(items) != 1 + len(names):
        raise SerializationError(
            f"cannot deserialize session message: {cls.__name__} has {len(names)} fields, "
            f"not {len(items) - 1}"
        )
    values = []
    for name, value in zip(names, items[1:], strict=True):
        kind = ENUMS.get((cls, name))
        if kind is not None:
            try:
                value = kind(value)
            except (ValueError, TypeError):
                raise SerializationError(
                    f"cannot deserialize session message: {cls.__name__}.{name} is "
                    f"{str(value)[:40]!r}, not one of {[m.value for m in kind]}"
                ) from None
        elif isinstance(value, list):
            value = _build(value, depth + 1)
        values.append(value)
    return cls(*values)
