"""The 64-bit keys of each session row and each flow row, in Python and in Spark.

The conversation screening (:mod:`persistence.analytics.screening`) groups every row that
shows a session end (a consumed message, a session a flow waits on, an outbox message), and
every flow row, by a few 64-bit keys. Spark computes them for the rows it reads; the Parquet
export computes the same keys in Python as it reads a row and stores them beside it, because
its bucketed layout (:mod:`persistence.analytics.layout`) is summed up and bucketed by them
at every refresh. ``xxhash64`` is Spark's (``XXH64`` with seed 42, each further column hashed
with the previous hash as its seed, nulls skipped), which the Python ``xxhash`` package
computes bit for bit; ``tests/analytics/test_analytics_screening.py`` holds the two forms to
agree. (Spark reading the stored keys instead of computing its own saved 6% of a 10 M-row
analysis: ``benchmarks/results/analytics_pieces.md``; not worth a second path.)

Of a session row of node ``N`` with session ``s`` and counterparty ``c`` (the sender of a
consumed message, the counterparty waited on, an outbox message's target): the session is the
responder's side when ``s`` ends in ``.r``, its initiator's id is ``b`` (``s`` without
``.r``), the initiator's node ``I`` is ``c`` on the responder's side and ``N`` on the
initiator's, the responder's node ``P`` the other one. Then:

* :data:`CONVERSATION`: ``xxhash64(b)``, shared by both ends of the session;
* :data:`INITIATOR_NODE`, :data:`RESPONDER_NODE`: ``xxhash64(I)``, ``xxhash64(P)``;
* :data:`INITIATOR_KEY`: ``xxhash64(I, F)``, the flow key of the initiating flow ``F``
  (:func:`~persistence.analytics.session_columns.session_flow` of ``s``; empty when not of
  the grammar);
* :data:`RESPONDER_KEY`: ``xxhash64(P, R)``, the flow key of the responder
  ``R = responder_flow_id(I, b)``;
* :data:`ODD`: what the screening does not judge: a null session or counterparty, a session
  not of the grammar, an initiator session of a named node tagged for another, and for a
  consumed message an irregular id or sequence number;
* for a wait, :data:`OWN`: the waiting flow is the end's own flow (``F`` on the initiator's
  side, ``R`` on the responder's).

Of a flow row (checkpoint, blob, result, exception): :data:`FLOW_KEY`, ``xxhash64(N, flow)``.

The node's own name is in most of them: the export stores them only for a node named on the
command line (``NAME=URL``), the only nodes that get a layout.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from statemachine.session_ids import (
    MESSAGE_ID_PREFIX,
    RESPONDER_NAMESPACE,
    RESPONDER_SUFFIX,
    SESSION_SEPARATOR,
    TAG_LENGTH,
    identity_tag,
)

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import Column, DataFrame


CONVERSATION = "conversation"
"""``xxhash64`` of the session's initiator id (both ends share it)."""
RESPONDER = "responder"
"""The row is of the responder's end (its session id ends in ``.r``)."""
INITIATOR_NODE = "initiator_node"
"""``xxhash64`` of the initiator's node name."""
RESPONDER_NODE = "responder_node"
"""``xxhash64`` of the responder's node name."""
INITIATOR_KEY = "initiator_key"
"""The flow key of the initiating flow on the initiator's node."""
RESPONDER_KEY = "responder_key"
"""The flow key of the responder flow on the responder's node."""
ODD = "odd"
"""The row is malformed or irregular (the screening leaves its conversation to the rules)."""
OWN = "own"
"""A wait's flow is the end's own flow (the initiating flow, or the responder)."""
FLOW_KEY = "flow_key"
"""``xxhash64(node, flow_id)`` of a flow row."""
SESSION_KEYS = (
    CONVERSATION,
    RESPONDER,
    INITIATOR_NODE,
    RESPONDER_NODE,
    INITIATOR_KEY,
    RESPONDER_KEY,
    ODD,
)
"""The keys of every session row (a wait has :data:`OWN` too)."""
SESSION_KEY_TYPES = {
    CONVERSATION: "bigint",
    RESPONDER: "boolean",
    INITIATOR_NODE: "bigint",
    RESPONDER_NODE: "bigint",
    INITIATOR_KEY: "bigint",
    RESPONDER_KEY: "bigint",
    ODD: "boolean",
    OWN: "boolean",
}
"""Spark's type of each key."""
MAX_SEQUENCE = (1 << 63) - 1
"""The largest sequence number (the screening adds one to it: ``odd`` beyond)."""

_JAVA_LINE_BREAKS = re.compile("[\n\r\u0085\u2028\u2029]")
_HEX = frozenset("0123456789abcdef")


# --- Python, for the export ------------------------------------------------------------------


@functools.cache
def _xxh64() -> Callable[[bytes, int], int]:
    """The ``xxhash`` package's XXH64 (imported on first use: the ``spark`` extra's)."""
    from xxhash import xxh64_intdigest

    return xxh64_intdigest


def spark_xxhash64(*values: str | int | None) -> int:
    """Spark's ``xxhash64`` of strings (UTF-8) and 64-bit integers, nulls skipped (signed)."""
    xxh64_intdigest = _xxh64()
    seed = 42
    for value in values:
        if value is None:
            continue
        data = (
            value.encode()
            if isinstance(value, str)
            else (value & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
        )
        seed = xxh64_intdigest(data, seed)
    return _signed(seed)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


@functools.lru_cache(maxsize=4096)
def _name_hash(name: str | None) -> int:
    """``xxhash64(name)`` unsigned (the seed of the next column's hash): names repeat."""
    return 42 if name is None else _xxh64()(name.encode(), 42)


def _then(seed: int, value: str) -> int:
    """Spark's ``xxhash64(x, value)`` given ``xxhash64(x)`` unsigned (``seed``), signed."""
    hashed = _xxh64()(value.encode(), seed)
    return hashed - (1 << 64) if hashed >= 1 << 63 else hashed


@functools.lru_cache(maxsize=4096)
def _own_tag(name: str) -> str:
    return identity_tag(name) + "-"


@functools.lru_cache(maxsize=4096)
def _responder_prefix(initiator: str) -> bytes:
    """The bytes hashed before the session: the namespace and ``"<initiator>|"``."""
    return RESPONDER_NAMESPACE.bytes + f"{initiator}|".encode()


def _base(session: str) -> str:
    return session[: -len(RESPONDER_SUFFIX)] if session.endswith(RESPONDER_SUFFIX) else session


def python_session_flow(session: str) -> str | None:
    """Spark's ``session_flow`` in Python (None where Java's regex could differ: line breaks).

    :data:`SESSION_FLOW_PATTERN` by string operations: the flow is what comes before the
    last ``.s`` (only the last can be followed by digits to the end), less a leading tag of
    16 lowercase hex digits and a dash when something is left after it.
    """
    if _JAVA_LINE_BREAKS.search(session):
        return None
    head, separator, number = _base(session).rpartition(SESSION_SEPARATOR)
    if not (separator and head and number.isascii() and number.isdigit()):
        return ""
    tag, rest = head[:TAG_LENGTH], head[TAG_LENGTH + 1 :]
    if rest and head[TAG_LENGTH] == "-" and _HEX.issuperset(tag):
        return rest
    return head


def _responder_flow(initiator: str, base: str) -> str:
    """``statemachine.session_ids.responder_flow_id`` (UUID5, hex), without the UUID object."""
    digest = bytearray(hashlib.sha1(_responder_prefix(initiator) + base.encode()).digest())
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    return digest[:16].hex()


def _foreign_tag(session: str, node: str) -> bool:
    """An initiator session id carrying a tag (any 16 characters and a dash) not ``node``'s."""
    return (
        len(session) > TAG_LENGTH
        and session[TAG_LENGTH] == "-"
        and not session.startswith(_own_tag(node))
    )


def python_session_keys(
    node: str | None,
    session: str | None,
    counterparty: str | None,
    flow_id: str | None = None,
) -> dict[str, Any] | None:
    """The keys of one session row of ``node``: every key, or None when ``node`` is None.

    ``node`` is the node's name, or None when the export does not know it (then Spark
    computes the keys). ``flow_id``: the waiting flow of a wait (gives :data:`OWN`). Where
    Python cannot be sure to give what Spark would (a null session or counterparty, a line
    break in the session), the flow keys are null and the row :data:`ODD`: the screening
    leaves its conversation to the rules, which read the ids themselves.
    """
    if node is None:
        return None
    values = _session_key_values(node, session, counterparty, flow_id)
    keys = dict(zip(SESSION_KEYS, values[:-1], strict=True))
    if flow_id is not None:
        keys[OWN] = values[-1]
    return keys


def _session_key_values(
    node: str, session: str | None, counterparty: str | None, flow_id: str | None
) -> tuple[Any, ...]:
    """:func:`python_session_keys` as a tuple: the :data:`SESSION_KEYS`, then :data:`OWN`."""
    responder = session is not None and session.endswith(RESPONDER_SUFFIX)
    base = None if session is None else _base(session)
    initiator, other = (counterparty, node) if responder else (node, counterparty)
    initiator_seed, other_seed = _name_hash(initiator), _name_hash(other)
    conversation = 42 if base is None else _then(42, base)
    first = None if session is None else python_session_flow(session)
    if first is None or base is None or initiator is None or other is None:
        return (
            conversation,
            responder,
            _signed(initiator_seed),
            _signed(other_seed),
            None,
            None,
            True,
            False,
        )
    second = _responder_flow(initiator, base)
    return (
        conversation,
        responder,
        _signed(initiator_seed),
        _signed(other_seed),
        _then(initiator_seed, first),
        _then(other_seed, second),
        first == "" or (not responder and _foreign_tag(base, node)),
        flow_id == (second if responder else first),
    )


def python_record_odd(message_id: str | None, session: str, sequence: int | None) -> bool:
    """A consumed message's id is not the one its session and sequence number give."""
    if message_id is None or sequence is None or sequence < 0 or sequence >= MAX_SEQUENCE:
        return True
    peer = _base(session) if session.endswith(RESPONDER_SUFFIX) else session + RESPONDER_SUFFIX
    return message_id != f"{MESSAGE_ID_PREFIX}{peer}-{sequence}"


RECORD_KEYS = SESSION_KEYS
"""The keys the export stores beside each ``node_message_ids`` row, in this order."""


def arrow_record_keys(
    node: str | None,
    message_ids: Sequence[str | None],
    senders: Sequence[str | None],
    sessions: Sequence[str | None],
    sequences: Sequence[int | None],
) -> list[pyarrow.Array]:
    """The :data:`RECORD_KEYS` arrays of ``node_message_ids`` rows (nulls: left to Spark)."""
    import pyarrow as pa

    if node is None:
        return [
            pa.nulls(
                len(message_ids), pa.bool_() if SESSION_KEY_TYPES[name] == "boolean" else pa.int64()
            )
            for name in RECORD_KEYS
        ]
    odd = RECORD_KEYS.index(ODD)
    rows = []
    for message_id, sender, session, sequence in zip(
        message_ids, senders, sessions, sequences, strict=True
    ):
        values = list(_session_key_values(node, session, sender, None)[: len(RECORD_KEYS)])
        values[odd] = (
            values[odd] or session is None or python_record_odd(message_id, session, sequence)
        )
        rows.append(values)
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in RECORD_KEYS]
    return [
        pa.array(values, pa.bool_() if SESSION_KEY_TYPES[name] == "boolean" else pa.int64())
        for name, values in zip(RECORD_KEYS, columns, strict=True)
    ]


def arrow_flow_keys(node: str | None, flow_ids: Sequence[str | None]) -> pyarrow.Array:
    """The :data:`FLOW_KEY` array of flow rows (nulls when the node's name is not known)."""
    import pyarrow as pa

    if node is None:
        return pa.nulls(len(flow_ids), pa.int64())
    return pa.array(
        [None if flow is None else spark_xxhash64(node, flow) for flow in flow_ids], pa.int64()
    )


# --- Spark --------------------------------------------------------------------------------


def session_keys(
    node: Column,
    session: Column,
    counterparty: Column,
    *,
    named: list[str],
    flow_id: Column | None = None,
    record: tuple[Column, Column] | None = None,
) -> dict[str, Column]:
    """The keys of session rows as Spark computes them.

    ``named``: the nodes whose names were given (the tag rule applies to them);
    ``flow_id``: the waiting flow (for :data:`OWN`); ``record``: a consumed message's
    (``message_id``, ``sequence``) (its :data:`ODD` includes an irregular id).
    """
    from pyspark.sql import functions as F

    from persistence.analytics.session_columns import (
        expected_message_id,
        initiator_session,
        is_responder,
        peer_session,
        responder_flow_id,
        session_flow,
    )

    responder = F.coalesce(is_responder(session), F.lit(False))
    base = initiator_session(session)
    initiator = F.when(responder, counterparty).otherwise(node)
    other = F.when(responder, node).otherwise(counterparty)
    first = session_flow(session)
    second = responder_flow_id(initiator, base)
    tags = {name: identity_tag(name) for name in named}
    own_tag = (
        F.element_at(F.create_map(*[F.lit(x) for pair in tags.items() for x in pair]), node)
        if tags
        else F.lit(None).cast("string")
    )
    foreign = (
        ~responder
        & (F.substring(session, TAG_LENGTH + 1, 1) == "-")
        & own_tag.isNotNull()
        & ~session.startswith(F.concat(F.coalesce(own_tag, F.lit("")), F.lit("-")))
    )
    odd = (
        session.isNull()
        | counterparty.isNull()
        | node.isNull()
        | (F.coalesce(first, F.lit("")) == "")
        | F.coalesce(foreign, F.lit(False))
    )
    if record is not None:
        message_id, sequence = record
        expected = expected_message_id(peer_session(session), sequence)
        regular = (message_id == expected) & (sequence >= 0) & (sequence < MAX_SEQUENCE)
        odd = odd | ~F.coalesce(regular, F.lit(False))
    keys = {
        CONVERSATION: F.xxhash64(base),
        RESPONDER: responder,
        INITIATOR_NODE: F.xxhash64(initiator),
        RESPONDER_NODE: F.xxhash64(other),
        INITIATOR_KEY: F.xxhash64(initiator, first),
        RESPONDER_KEY: F.xxhash64(other, second),
        ODD: F.coalesce(odd, F.lit(True)),
    }
    if flow_id is not None:
        mine = F.when(responder, second).otherwise(first)
        keys[OWN] = F.coalesce(flow_id == mine, F.lit(False))
    return keys


def flow_keys(frame: DataFrame, *columns: str | Column) -> DataFrame:
    """``frame``'s flow rows as (:data:`FLOW_KEY`, ``columns``)."""
    from pyspark.sql import functions as F

    return frame.select(F.xxhash64("node", "flow_id").alias(FLOW_KEY), *columns)


def node_hashes(names: list[str]) -> list[int]:
    """``xxhash64`` of each node name, as Spark gives it."""
    return [spark_xxhash64(name) for name in names]
