"""The 64-bit keys of each session row and each flow row, as Spark computes them.

The conversation screening (:mod:`persistence.analytics.screening`) groups every row that
shows a session end (a consumed message, a session a flow waits on, an outbox message), and
every flow row, by a few 64-bit keys: Spark's ``xxhash64`` (``XXH64`` with seed 42, each
further column hashed with the previous hash as its seed, nulls skipped).

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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from statemachine.session_ids import (
    TAG_LENGTH,
    identity_tag,
)

if TYPE_CHECKING:
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
MAX_SEQUENCE = (1 << 63) - 1
"""The largest sequence number (the screening adds one to it: ``odd`` beyond)."""


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
