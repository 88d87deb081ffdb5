"""The frame: how a :class:`~messaging.service.Message` travels on a durable transport.

Every transport (the in-memory test double included) carries a message as one byte
string, ``msgpack([FRAME_VERSION, message_id, topic, sender, data, signature])``. A receiver
that cannot decode a frame (garbage bytes, truncated msgpack, wrong field types, an unknown
version, over the size limit) does not hand it to the node: it moves it to the transport's
dead-letter store with the reason and acknowledges it, so it never loops.
"""

from __future__ import annotations

from typing import Any

import msgpack

from messaging.service import Message

FRAME_VERSION = 1
"""The frame layout version written by this code; other versions are refused."""

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""Frames larger than this are refused by both sender and receiver."""

_FIELDS = ("message_id", "topic", "sender")


class MalformedFrameError(ValueError):
    """A frame that cannot be decoded; the message says which rule it broke."""


def encode_frame(message: Message) -> bytes:
    """The bytes ``message`` travels as."""
    frame: bytes = msgpack.packb(
        [
            FRAME_VERSION,
            message.message_id,
            message.topic,
            message.sender,
            message.data,
            message.signature,
        ],
        use_bin_type=True,
    )
    if len(frame) > MAX_FRAME_BYTES:
        raise MalformedFrameError(
            f"message {message.message_id} is {len(frame)} bytes framed; "
            f"the limit is {MAX_FRAME_BYTES}"
        )
    return frame


def decode_frame(raw: bytes) -> Message:
    """Parse a frame; raises :class:`MalformedFrameError` naming what is wrong with it."""
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise MalformedFrameError(f"a frame is bytes, not {type(raw).__name__}")
    if len(raw) > MAX_FRAME_BYTES:
        raise MalformedFrameError(f"frame of {len(raw)} bytes exceeds {MAX_FRAME_BYTES}")
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
    version, message_id, topic, sender, data, signature = fields
    if version != FRAME_VERSION:
        raise MalformedFrameError(f"undecodable frame: unknown frame version {version!r}")
    for name, value in zip(_FIELDS, (message_id, topic, sender), strict=True):
        if not isinstance(value, str) or not value:
            raise MalformedFrameError(f"undecodable frame: field {name} is not a non-empty string")
    if not isinstance(data, bytes):
        raise MalformedFrameError("undecodable frame: field data is not bytes")
    if not isinstance(signature, bytes):
        raise MalformedFrameError("undecodable frame: field signature is not bytes")
    return Message(message_id, topic, sender, data, signature)


def peek_message_id(raw: bytes) -> str | None:
    """The message id of a frame if it can be read, else None (for dead-letter records)."""
    try:
        return decode_frame(raw).message_id
    except MalformedFrameError:
        return None
