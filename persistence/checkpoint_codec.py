"""Checkpoints to bytes and back, allowing exactly the state machine's own value types."""

from __future__ import annotations

from persistence.serialization import (
    SerializationError,
    SerializationLimits,
    Serializer,
    TypeRegistry,
)
from statemachine import flow_error, iorequests, session_messages, state
from statemachine.persistent import VECTOR_TYPE
from statemachine.session_table import SessionTable

CHECKPOINT_FORMAT = 1
"""Version of the checkpoint blob layout; bumped when a stored field changes meaning."""

CHECKPOINT_TYPES = TypeRegistry(
    [
        state.FlowStatus,
        state.StartedLocally,
        state.InitiatedBy,
        state.Value,
        state.Raised,
        state.JournalEntry,
        state.EarlyMessage,
        state.SessionState,
        state.Pending,
        state.Checkpoint,
        flow_error.ErrorKind,
        flow_error.FlowError,
        iorequests.Receive,
        iorequests.Sleep,
        session_messages.ConfirmSession,
        session_messages.SessionData,
        session_messages.SessionEnd,
        session_messages.SessionErrorBody,
        session_messages.SessionReject,
    ]
)

CHECKPOINT_LIMITS = SerializationLimits(
    max_bytes=256 * 1024 * 1024,
    max_collection_length=10_000_000,
    max_string_length=16 * 1024 * 1024,
    max_bytes_length=64 * 1024 * 1024,
)
"""Checkpoints are written by the node itself and grow with the journal: wider limits."""

_SERIALIZER = Serializer(
    CHECKPOINT_TYPES, "checkpoint", CHECKPOINT_LIMITS, tuple_types=(VECTOR_TYPE, SessionTable)
)
"""Sessions and journal are persistent sequences in memory (a session table and a pyrsistent
vector) and plain tuples in the blob (the blob layout is the same as when they were tuples)."""


def encode_checkpoint(checkpoint: state.Checkpoint) -> bytes:
    """The blob stored in ``node_checkpoint_blobs``."""
    return _SERIALIZER.encode([CHECKPOINT_FORMAT, checkpoint])


def decode_checkpoint(blob: bytes) -> state.Checkpoint:
    """Rebuild a checkpoint from its blob; raises SerializationError if it is not one."""
    decoded = _SERIALIZER.decode(blob)
    if (
        not isinstance(decoded, list)
        or len(decoded) != 2
        or decoded[0] != CHECKPOINT_FORMAT
        or not isinstance(decoded[1], state.Checkpoint)
    ):
        raise SerializationError(
            f"not a checkpoint blob of format {CHECKPOINT_FORMAT}: {str(decoded)[:80]}"
        )
    return decoded[1]
