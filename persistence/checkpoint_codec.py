"""Checkpoints to bytes and back, allowing exactly the state machine's own value types.

A blob is written in format 2: the checkpoint as nested msgpack arrays by position (each
class's fields in the order of its attrs fields, a union of classes as ``[tag, fields...]``,
an enum member as its value), packed in ONE msgpack call and unpacked in one. Nothing runs
per nested object while packing (format 1, the allow-list serializer of
:mod:`foundation.serialization`, packed every object as an extension type of its own, one
pack call each), and reading walks known positions instead of looking up class names.

Blobs of format 1 are still read (a node upgraded over its old checkpoints resumes them), and
format 1 is still written for the rare checkpoint msgpack cannot carry by position (a
journaled integer over 64 bits). The blob's first array item says which format it is.

Journaled values (:data:`~statemachine.iorequests.Plain`: request signatures, returned values)
hold tuples and never lists, so format 2 reads every array inside them back as a tuple.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs
import msgpack

from foundation.serialization import (
    SerializationError,
    SerializationLimits,
    Serializer,
    TypeRegistry,
)
from statemachine import flow_error, iorequests, session_messages, state
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.immutable import VECTOR_TYPE, replace
from statemachine.iorequests import Plain, Receive, RetryPolicy, RunOperation, Sleep
from statemachine.session_messages import (
    ConfirmSession,
    SessionData,
    SessionEnd,
    SessionErrorBody,
    SessionReject,
)
from statemachine.session_table import SessionTable
from statemachine.state import (
    Checkpoint,
    EarlyMessage,
    FlowStatus,
    InitiatedBy,
    JournalEntry,
    Pending,
    Raised,
    SessionState,
    StartedLocally,
    Value,
)

CHECKPOINT_FORMAT = 2
"""Version of the checkpoint blob layout written; bumped when a stored field changes meaning."""

FIRST_FORMAT = 1
"""The allow-list serializer's layout: still read, and written when format 2 cannot be."""

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
        iorequests.RunOperation,
        iorequests.RetryPolicy,
        session_messages.ConfirmSession,
        session_messages.SessionData,
        session_messages.SessionEnd,
        session_messages.SessionErrorBody,
        session_messages.SessionReject,
    ]
)
"""The classes a checkpoint is made of (format 1 names them in the blob)."""

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
"""Format 1. Sessions and journal are persistent sequences in memory (a session table and a
pyrsistent vector) and plain tuples in the blob (the layout is the same as when they were
tuples)."""

_STATUSES = {status.value: status for status in FlowStatus}
_KINDS = {kind.value: kind for kind in ErrorKind}


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The blob stored in ``node_checkpoint_blobs`` (format 2, or 1 if 2 cannot carry it).

    A long journal is not packed again at every commit: what was packed of it before is
    reused (see :class:`JournalCache`), so a commit packs the entries added since.
    """
    try:
        if len(checkpoint.journal) >= JournalCache.MIN_ENTRIES:
            packed = _JOURNALS.encode(checkpoint)
        else:
            packed = msgpack.packb(_checkpoint(checkpoint), use_bin_type=True)
    except (OverflowError, TypeError):  # an integer over 64 bits, say: format 1 carries it
        return encode_checkpoint_format_1(checkpoint)
    if len(packed) > CHECKPOINT_LIMITS.max_bytes:
        raise SerializationError(
            f"cannot serialize checkpoint: {len(packed)} bytes encoded, over the limit "
            f"max_bytes ({CHECKPOINT_LIMITS.max_bytes})"
        )
    return packed


def forget_journals(flow_ids: Iterable[str]) -> None:
    """Drop the process's packed journals of these flows (see :class:`JournalCache`).

    Called when their checkpoints are removed. Only a cache: if the removal rolls back, the
    next commit of such a flow packs its journal whole.
    """
    _JOURNALS.forget(flow_ids)


def encode_checkpoint_format_1(checkpoint: Checkpoint) -> bytes:
    """The blob of ``checkpoint`` in format 1 (the allow-list serializer's layout)."""
    return _SERIALIZER.encode([FIRST_FORMAT, checkpoint])


def decode_checkpoint(blob: bytes) -> Checkpoint:
    """Rebuild a checkpoint from its blob; raises SerializationError if it is not one."""
    if blob[:2] == _FORMAT_2_PREFIX:
        return _decode_format_2(blob)
    decoded = _SERIALIZER.decode(blob)
    if (
        not isinstance(decoded, list)
        or len(decoded) != 2
        or decoded[0] != FIRST_FORMAT
        or not isinstance(decoded[1], Checkpoint)
    ):
        raise SerializationError(
            f"not a checkpoint blob of format {FIRST_FORMAT} or {CHECKPOINT_FORMAT}: "
            f"{str(decoded)[:80]}"
        )
    return decoded[1]


# --- format 2: writing --------------------------------------------------------------------

_BODY_TAGS = {
    ConfirmSession: 0,
    SessionData: 1,
    SessionEnd: 2,
    SessionErrorBody: 3,
    SessionReject: 4,
}
_FIELDS = 13
"""Items in a format-2 blob's outer array: the format and the checkpoint's 12 fields."""
_FORMAT_2_PREFIX = bytes([0x90 + _FIELDS, CHECKPOINT_FORMAT])
"""How a format-2 blob starts: a 13-item array whose first item is 2 (format 1 starts with a
2-item array)."""


def _checkpoint(c: Checkpoint) -> list[Any]:
    return [*_before_journal(c), [_entry(entry) for entry in c.journal], *_after_journal(c)]


def _before_journal(c: Checkpoint) -> list[Any]:
    origin = c.origin
    return [
        CHECKPOINT_FORMAT,
        c.flow_id,
        [0, origin.flow_class, origin.arguments, *([origin.generation] * bool(origin.generation))]
        if isinstance(origin, StartedLocally)
        else [
            1,
            origin.flow_class,
            origin.session_id,
            origin.counterparty,
            origin.counterparty_flow_version,
            origin.counterparty_app_name,
        ],
        c.status.value,
        c.created_at,
        [_session(s) for s in c.sessions],
    ]


def _after_journal(c: Checkpoint) -> list[Any]:
    return [
        None if c.pending is None else _pending(c.pending),
        c.next_session_index,
        None if c.error is None else _error(c.error),
        c.progress_step,
        c.session_tag,
        c.version,
    ]


def _entry(entry: JournalEntry) -> list[Any]:
    return [entry.signature, _outcome(entry.outcome)]


@attrs.frozen
class _PackedJournal:
    """A flow's journal entries ``[0, count)`` packed, and two of them to know them by."""

    count: int
    first: JournalEntry
    last: JournalEntry
    packed: bytes


class JournalCache:
    """What was packed of long journals, so that a commit packs only the entries it adds.

    A journal only grows, and its entries are immutable values shared by every later
    version of it: if a checkpoint's journal holds, at the positions a packed prefix covers,
    the very entry objects that prefix was packed from (its first and its last, compared by
    identity), the prefix's bytes are those entries' bytes. A journal built apart (read back
    from a blob, after a restart or a retry) holds other objects and is packed whole. The
    blob is byte for byte what packing the whole checkpoint at once makes (msgpack packs an
    array as its header followed by its items).

    Only journals of at least :data:`MIN_ENTRIES` entries are kept (a short one packs in
    microseconds), at most :data:`MAX_BYTES` in all, the least recently used dropped first.
    """

    MIN_ENTRIES = 64
    """Journals shorter than this are packed whole each time."""
    MAX_BYTES = 64 * 1024 * 1024
    """The most packed bytes kept, over every flow of the process."""

    def __init__(self) -> None:
        self._journals: dict[str, _PackedJournal] = {}
        self._bytes = 0

    def encode(self, checkpoint: Checkpoint) -> bytes:
        """``checkpoint`` packed in format 2, reusing what was packed of its journal.

        Raises what msgpack raises for a value it cannot pack.
        """
        journal = checkpoint.journal
        count = len(journal)
        known = self._journals.pop(checkpoint.flow_id, None)
        if known is not None:
            self._bytes -= len(known.packed)
            if not (
                known.count <= count
                and journal[0] is known.first
                and journal[known.count - 1] is known.last
            ):
                known = None
        done, packed = (0, b"") if known is None else (known.count, known.packed)
        added = [_entry(entry) for entry in journal[done:]]
        if added:
            packed += msgpack.packb(added, use_bin_type=True)[_array_header_size(len(added)) :]
        self._remember(checkpoint.flow_id, _PackedJournal(count, journal[0], journal[-1], packed))
        before = msgpack.packb(_before_journal(checkpoint), use_bin_type=True)
        after = msgpack.packb(_after_journal(checkpoint), use_bin_type=True)
        return b"".join(
            (
                _FORMAT_2_PREFIX[:1],
                before[1:],  # both are arrays of under 16 items: a one-byte header
                _array_header(count),
                packed,
                after[1:],
            )
        )

    def forget(self, flow_ids: Iterable[str]) -> None:
        """Drop what was packed of these flows' journals (their checkpoints are gone)."""
        for flow_id in flow_ids:
            known = self._journals.pop(flow_id, None)
            if known is not None:
                self._bytes -= len(known.packed)

    def __len__(self) -> int:
        """How many flows' journals are kept."""
        return len(self._journals)

    def _remember(self, flow_id: str, packed: _PackedJournal) -> None:
        self._journals[flow_id] = packed
        self._bytes += len(packed.packed)
        while self._bytes > self.MAX_BYTES and self._journals:
            oldest = next(iter(self._journals))
            self._bytes -= len(self._journals.pop(oldest).packed)


_JOURNALS = JournalCache()
"""The process's cache of packed journals (keyed by flow id; see :class:`JournalCache`)."""


def _array_header(count: int) -> bytes:
    """Msgpack's header of an array of ``count`` items."""
    if count < 16:
        return bytes([0x90 + count])
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _array_header_size(count: int) -> int:
    return 1 if count < 16 else 3 if count < 0x10000 else 5


def _session(s: SessionState) -> list[Any]:
    return [
        s.session_id,
        s.peer_session_id,
        s.counterparty,
        s.initiated_by_us,
        s.initiating_flow,
        s.flow_version,
        s.app_name,
        s.initial_sent,
        s.confirmed,
        s.peer_flow_version,
        s.peer_app_name,
        s.closed_by_us,
        s.next_send_sequence,
        s.next_receive_sequence,
        [_body(item) for item in s.inbox],
        [[early.sequence, _body(early.body)] for early in s.early],
    ]


def _body(body: Any) -> list[Any]:
    tag = _BODY_TAGS[type(body)]
    if tag == 0:
        return [0, body.flow_version, body.app_name]
    if tag == 1:
        return [1, body.payload]
    if tag == 2:
        return [2]
    if tag == 3:
        return [3, _error(body.error)]
    return [4, body.reason]


def _error(error: FlowError) -> list[Any]:
    return [error.kind.value, error.exception_class, error.message, error.error_id]


def _outcome(outcome: Value | Raised) -> list[Any]:
    if isinstance(outcome, Value):
        return [0, outcome.value]
    return [1, _error(outcome.error)]


def _pending(pending: Pending) -> list[Any]:
    request = pending.request
    if isinstance(request, Receive):
        return [[0, list(request.session_ids), request.timeout], pending.deadline]
    if isinstance(request, RunOperation):
        policy = request.policy
        waits = [policy.backoff, policy.multiplier, policy.max_backoff, policy.jitter]
        retry = [policy.attempts, *waits, list(policy.retry_on)]
        operation = [2, request.label, request.ordinal, request.name, request.timeout]
        return [[*operation, retry, request.attempt, request.backing_off], pending.deadline]
    return [[1, request.seconds], pending.deadline]


# --- format 2: reading --------------------------------------------------------------------


def _decode_format_2(blob: bytes) -> Checkpoint:
    limits = CHECKPOINT_LIMITS
    try:
        items = msgpack.unpackb(
            blob,
            raw=False,
            use_list=True,
            max_str_len=limits.max_string_length * 4,
            max_bin_len=limits.max_bytes_length,
            max_array_len=limits.max_collection_length,
            max_map_len=0,
            max_ext_len=0,
        )
        return _read_checkpoint(items)
    except SerializationError:
        raise
    except Exception as error:  # a blob that is not what its prefix claims
        raise SerializationError(
            f"not a checkpoint blob of format {CHECKPOINT_FORMAT}: {type(error).__name__}: {error}"
        ) from None


def _read_checkpoint(items: list[Any]) -> Checkpoint:
    (
        _format,
        flow_id,
        origin,
        status,
        created_at,
        sessions,
        journal,
        pending,
        next_session_index,
        error,
        progress_step,
        session_tag,
        version,
    ) = items
    return Checkpoint(
        flow_id=flow_id,
        origin=StartedLocally(*origin[1:]) if origin[0] == 0 else InitiatedBy(*origin[1:]),
        status=_STATUSES[status],
        created_at=created_at,
        sessions=SessionTable([_read_session(s) for s in sessions]),
        journal=[JournalEntry(_signature(sig), _read_outcome(out)) for sig, out in journal],
        pending=None if pending is None else _read_pending(pending),
        next_session_index=next_session_index,
        error=None if error is None else _read_error(error),
        progress_step=progress_step,
        session_tag=session_tag,
        version=version,
    )


def _read_session(items: list[Any]) -> SessionState:
    fields: list[Any] = items[:-2]
    inbox = tuple(_read_body(item) for item in items[-2])
    early = tuple(EarlyMessage(sequence, _read_body(body)) for sequence, body in items[-1])
    session: SessionState = SessionState(*fields, inbox, early)  # type: ignore[call-arg]
    return session


def _read_body(items: list[Any]) -> Any:
    tag = items[0]
    if tag == 0:
        return ConfirmSession(items[1], items[2])
    if tag == 1:
        return SessionData(items[1])
    if tag == 2:
        return SessionEnd()
    if tag == 3:
        return SessionErrorBody(_read_error(items[1]))
    if tag == 4:
        return SessionReject(items[1])
    raise SerializationError(f"not a checkpoint blob: unknown session body tag {tag!r}")


def _read_error(items: list[Any]) -> FlowError:
    kind, exception_class, message, error_id = items
    return FlowError(_KINDS[kind], exception_class, message, error_id)


def _read_outcome(items: list[Any]) -> Value | Raised:
    if items[0] == 0:
        return Value(_plain(items[1]))
    return Raised(_read_error(items[1]))


def _read_pending(items: list[Any]) -> Pending:
    request, deadline = items
    if request[0] == 0:
        return Pending(Receive(tuple(request[1]), request[2]), deadline)
    if request[0] == 2:
        _, label, ordinal, name, timeout, retry, attempt, backing_off = request
        attempts, backoff, multiplier, max_backoff, jitter, retry_on = retry
        policy = RetryPolicy(attempts, backoff, multiplier, max_backoff, jitter, tuple(retry_on))
        operation = RunOperation(label, ordinal, name, timeout, policy)
        return Pending(replace(operation, attempt=attempt, backing_off=backing_off), deadline)
    return Pending(Sleep(request[1]), deadline)


def _signature(value: Any) -> tuple[Plain, ...]:
    """A request signature as it was journaled: a tuple."""
    if type(value) is not list:
        raise SerializationError(f"not a checkpoint blob: a signature {str(value)[:40]!r}")
    return tuple(_plain(item) for item in value)


def _plain(value: Any) -> Plain:
    """A journaled value as it was: its arrays are tuples (journaled values hold no lists)."""
    if type(value) is list:
        return tuple(_plain(item) for item in value)
    plain: Plain = value
    return plain
