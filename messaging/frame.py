"""The frame: how a :class:`~messaging.service.Message` travels on a durable transport.

Every transport (the in-memory test double included) carries a message as one byte
string, ``msgpack([FRAME_VERSION, message_id, topic, sender, data, tag])``, where ``tag`` is
the sender's HMAC-SHA256 of the message for its target (:mod:`messaging.authentication`;
empty if the message is not authenticated). Version 1 carried an Ed25519 signature in that
field instead; such frames are refused with a reason saying so. A receiver
that cannot decode a frame (garbage bytes, truncated msgpack, wrong field types, an unknown
version, over the size limit, a text field over its length limit or holding a NUL character)
does not hand it to the node: it moves it to the transport's dead-letter store with the reason
and acknowledges it, so it never loops. A body over the size limit is refused on its length
alone, before anything decodes it. The limits are those of :mod:`statemachine.limits`; a
sender checks them too, so it learns at once that a message cannot travel.
"""

from __future__ import annotations

from typing import Any

import msgpack

from messaging.service import Message
from statemachine.limits import (
    FRAME_BYTES,
    MESSAGE_ID_CHARS,
    PARTY_NAME_CHARS,
    TOPIC_CHARS,
    text_problem,
)

FRAME_VERSION = 2
"""The frame layout version written by this code; other versions are refused.

Version 2: the last field is an HMAC-SHA256 tag (version 1: an Ed25519 signature).
"""

RETIRED_FRAME_VERSIONS = {
    1: "frame version 1 (messages signed with Ed25519) is no longer accepted: this node "
    "authenticates messages with per-peer keys (frame version 2); the sender runs an older "
    "fiberflow and must be upgraded",
}
"""Versions this code once wrote, with the reason a frame of that version is refused."""

MAX_FRAME_BYTES = FRAME_BYTES
"""Frames larger than this are refused by both sender and receiver (``limits.FRAME_BYTES``)."""

FIELD_LIMITS = {
    "message_id": MESSAGE_ID_CHARS,
    "topic": TOPIC_CHARS,
    "sender": PARTY_NAME_CHARS,
}
"""The longest each text field of a frame may be, in characters."""


def oversized_problem(size: int, limit: int = MAX_FRAME_BYTES) -> str:
    """The reason a body of ``size`` bytes is refused (it names the size and the limit)."""
    return f"frame of {size} bytes exceeds the limit of {limit} bytes"


class MalformedFrameError(ValueError):
    """A frame that cannot be decoded; the message says which rule it broke."""


def encode_frame(message: Message) -> bytes:
    """The bytes ``message`` travels as; raises MalformedFrameError if no receiver takes it."""
    for name, limit in FIELD_LIMITS.items():
        problem = text_problem(name, getattr(message, name), limit)
        if problem is not None:
            raise MalformedFrameError(f"message {str(message.message_id)[:80]!r}: {problem}")
    frame: bytes = msgpack.packb(
        [
            FRAME_VERSION,
            message.message_id,
            message.topic,
            message.sender,
            message.data,
            message.tag,
        ],
        use_bin_type=True,
    )
    if len(frame) > MAX_FRAME_BYTES:
        raise MalformedFrameError(
            f"message {message.message_id} is {len(frame)} bytes framed; "
            f"the limit is {MAX_FRAME_BYTES}"
        )
    return frame


def decode_frame(raw: bytes, max_bytes: int = MAX_FRAME_BYTES, receipt: object = None) -> Message:
    """Parse a frame; raises :class:`MalformedFrameError` naming what is wrong with it.

    A frame over ``max_bytes`` is refused on its length, before it is decoded. ``receipt``
    is the transport's handle of this delivery (see :class:`~messaging.service.Message`).
    """
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise MalformedFrameError(f"a frame is bytes, not {type(raw).__name__}")
    if len(raw) > max_bytes:
        raise MalformedFrameError(oversized_problem(len(raw), max_bytes))
    try:
        fields: Any = msgpack.unpackb(
            bytes(raw),
            raw=False,
            use_list=True,
            strict_map_key=True,
        )
    except Exception as error:  # msgpack raises several types for bad input
        raise MalformedFrameError(f"undecodable frame: {type(error).__name__}: {error}") from None
    if not isinstance(fields, list) or len(fields) != 6:
        raise MalformedFrameError("undecodable frame: not a list of 6 fields")
    version, message_id, topic, sender, data, tag = fields
    if version != FRAME_VERSION:
        retired = RETIRED_FRAME_VERSIONS.get(version) if type(version) is int else None
        if retired is not None:
            raise MalformedFrameError(f"undecodable frame: {retired}")
        raise MalformedFrameError(f"undecodable frame: unknown frame version {version!r}")
    for (name, limit), value in zip(FIELD_LIMITS.items(), (message_id, topic, sender), strict=True):
        problem = text_problem(name, value, limit)
        if problem is not None:
            raise MalformedFrameError(f"undecodable frame: {problem}")
    if not isinstance(data, bytes):
        raise MalformedFrameError("undecodable frame: field data is not bytes")
    if not isinstance(tag, bytes):
        raise MalformedFrameError("undecodable frame: field tag is not bytes")
    return Message(message_id, topic, sender, data, tag, receipt)


def peek_message_id(raw: bytes) -> str | None:
    """The message id of a frame if it can be read, else None (for dead-letter records)."""
    try:
        return decode_frame(raw).message_id
    except MalformedFrameError:
        return None
