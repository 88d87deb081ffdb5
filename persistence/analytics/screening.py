"""The conversation screening: every session end of every node judged in two aggregations.

The cross-node checks (session consistency, session ownership, the exactly-once audit) and
the flow-level ones (node integrity, flow counts) ask of millions of rows questions whose
answer is nearly always "fine". This module answers them for the whole network at once, with
64-bit keys and no join of the big tables, and hands the checks only what is *not* plainly
fine: the **candidate** conversations, which they judge with their full rules on a snapshot
restricted to them (:mod:`persistence.analytics.candidates`), and the counts of the rest.

**A conversation** is one session as both its ends see it: the initiator's end ``S`` on node
A and the responder's end ``S.r`` on node B. Every row that shows a session end (a flow
waiting on it, a consumed message, a message in the outbox) names it, so all of a
conversation's rows share the initiator's session id and are grouped by a 64-bit hash of it
(:func:`~persistence.analytics.session_columns.conversation_key`): one shuffle of those rows,
one aggregation (:func:`_conversations`). Per conversation it tells:

* its **shape**: every row names the same two nodes (``A`` and ``B``, each the other's
  counterparty), so there is at most one initiator end and one responder end, and nothing is
  malformed (a null session or counterparty, an id not of the grammar, an initiator session
  tagged for another node, an outbox message older than ``--outbox-after``);
* its **messages**: each end consumed exactly the sequence numbers ``0..top``, once each:
  ``top + 1`` rows whose XOR of ``h(k) ^ h(k + 1)`` telescopes to ``h(0) ^ h(top + 1)``
  (``h`` is ``xxhash64``; any missing or repeated number breaks it but for a 64-bit
  collision), and every id is the one its session and sequence number give;
* its **flows**: the keys ``xxhash64(A, F)`` and ``xxhash64(B, R)`` of the initiating flow
  and the responder (the rows carry both, :mod:`~persistence.analytics.session_flows`), and
  whether a flow waiting on the end with that very id already shows it live;
* its **facts**: what the flows holding its ends say of it in their rows
  (:mod:`~persistence.analytics.flow_facts`): no end consumed a message numbered at or past
  what the other end's flow sent, and each end consumed every message its flow took in
  (``received - 1 <= top``). The facts show no session end by themselves: a conversation
  only they show is a candidate when a flow says it took in a message.

Then one more aggregation (:mod:`~persistence.analytics.flow_index`) brings together every
flow the nodes know with the flow keys the healthy conversations still need: a needed key
no node table holds makes its conversation a candidate, and a flow in more than one of a
node's tables is an **overlap** (what node integrity and the flow counts need).

A healthy conversation (right shape, right messages, every needed flow known) gives exactly
what the checks' full rules would: each of its ends ``ok`` (or ``not analyzed`` when the
other node was not given) in session consistency, each consumed end ``owned`` in session
ownership, no exactly-once finding. So the counts are exact, and every finding is among the
candidates. Hash collisions could only hide a finding: two flow keys or two conversations of
equal 64-bit hashes, or an XOR that cancels, about one chance in 2**64 each.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs

from persistence.analytics.check_results import CheckSettings, as_of_ms
from persistence.analytics.flow_index import (
    few_wanted,
    flow_index,
    flow_index_of_few,
    overlaps_of,
    unpaired_of,
)
from persistence.analytics.layout import (
    EVIDENCE,
    FLOWS,
    NODE_BOUNDS,
    SEEN_OUTBOX,
    SEEN_OWN_KNOWN,
    SEEN_OWN_WAIT,
    SEEN_RECORD,
    SEEN_WAIT,
    evidence_rows,
    session_ends,
)
from persistence.analytics.session_flows import (
    CONVERSATION,
    INITIATOR_KEY,
    MAX_SEQUENCE,
    ODD,
    RESPONDER,
    RESPONDER_KEY,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot


MESSAGE_SUMS = ("records", "top", "telescope")
"""What a session end's consumed messages sum up to (count, highest number, XOR)."""

INITIATOR_END = 1 << 0
"""A row of the initiator's end (session ``S``)."""
RESPONDER_END = 1 << 1
"""A row of the responder's end (session ``S.r``)."""
INITIATOR_CONSUMED = 1 << 2
"""The initiator's end consumed a message."""
RESPONDER_CONSUMED = 1 << 3
"""The responder's end consumed a message."""
INITIATOR_WAITING = 1 << 4
"""The initiating flow itself (by its id) waits on its end: it is live."""
RESPONDER_WAITING = 1 << 5
"""The responder flow itself waits on its end: it is live."""
INITIATOR_ANALYZED = 1 << 6
"""The initiator's node is analyzed."""
RESPONDER_ANALYZED = 1 << 7
"""The responder's node is analyzed."""
UNUSUAL = 1 << 8
"""Something the screening does not judge: a malformed row, an irregular id, an old outbox
message, an initiator session tagged for another node."""


MISSING_IN_DRIVER = 10_000
"""Needed flow keys no table holds, up to which they are looked up in a set of literals in
each conversation (a hash set in the generated code); more are joined (and the joined
conversations cached, as they are read twice)."""

SCREEN_ABOVE_ROWS = 200_000
"""Snapshots with fewer consumed messages and checkpoints than this are not screened: the
checks' rules judge every conversation (the screening's own Spark jobs cost more than it
saves on so few rows); only the flow index is built (for its overlaps)."""


@attrs.frozen
class Screen:
    """What the screening found (see the module docstring); its frames are cached."""

    conversations: int
    """Conversations seen (healthy and candidates)."""
    candidates: DataFrame | None
    """``conversation``: the key of every candidate conversation; None: every conversation is
    one (a snapshot below :data:`SCREEN_ABOVE_ROWS`, judged whole by the rules)."""
    candidate_count: int
    ends_ok: int
    """Session ends of healthy conversations whose counterpart flow is known."""
    ends_not_analyzed: int
    """Session ends of healthy conversations whose counterparty is not analyzed."""
    consumed_owned: int
    """Consumed session ends of healthy conversations (each held by its flow)."""
    overlaps: DataFrame
    """``flow_key``, ``live``, ``finished``, ``failed``: the flows in more than one of a
    node's checkpoints, results and exceptions."""
    overlap_count: int
    unpaired: DataFrame
    """``flow_key``: the flows with a checkpoint row and no blob, or a blob and no row."""
    missing_flows: int = 0
    """Needed flow keys no node table holds (their conversations are candidates)."""
    facts_only: int = 0
    """Candidate conversations only flows' facts show (no wait, record or outbox row): the
    candidates' snapshot looks their flows up by their facts."""


def screen(snapshot: Snapshot, settings: CheckSettings) -> Screen:
    """The screening of ``snapshot`` (computed once per snapshot and outbox threshold)."""
    old_before = as_of_ms(snapshot, settings) - settings.outbox_after_ms
    return snapshot.shared_value(("screen", old_before), lambda: _screen(snapshot, old_before))


def _bit(condition: Column, flag: int) -> Column:
    from pyspark.sql import functions as F

    return F.when(condition, F.lit(flag)).otherwise(F.lit(0))


def _ends(snapshot: Snapshot, old_before: int) -> DataFrame:
    """Every session end of the snapshot (:data:`~persistence.analytics.layout.EVIDENCE_SCHEMA`).

    The export's, bucketed by conversation, when the snapshot has them; else summed up here
    from the tables' rows (grouped by conversation first: the ends and then the
    conversations are grouped in one shuffle). An outbox message older than ``old_before``
    makes its end odd.
    """
    from pyspark.sql import functions as F

    if EVIDENCE in snapshot.layouts:
        ends = snapshot.layouts[EVIDENCE]
    else:
        named = [load.name for load in snapshot.nodes if load.named_by != "unknown"]
        rows = evidence_rows(snapshot.frames, named).repartition(CONVERSATION)
        ends = session_ends(rows)
    old = F.coalesce(F.col("outbox_since") <= old_before, F.lit(False))
    return ends.select(
        # named anew: Spark then sees the union keep its bucketing through the projection
        # (a bare column here made it plan a shuffle by conversation after all)
        F.col(CONVERSATION).alias(CONVERSATION),
        RESPONDER,
        "kinds",
        (F.col(ODD) | old).alias(ODD),
        *NODE_BOUNDS,
        INITIATOR_KEY,
        RESPONDER_KEY,
        *MESSAGE_SUMS,
        "sent",  # (an end whose flow took in more than its records is odd already)
    )


def _conversations(snapshot: Snapshot, old_before: int) -> DataFrame:
    """One row per conversation: its key, flags (a bit mask), flow keys and message checks."""
    from pyspark.sql import functions as F

    ends = _ends(snapshot, old_before)
    responder = F.col(RESPONDER)
    kinds = F.col("kinds")

    def seen(flag: int) -> Column:
        return kinds.bitwiseAND(flag) != 0

    analyzed = [F.xxhash64(F.lit(name)) for name in snapshot.node_names]
    shown = kinds.bitwiseAND(SEEN_WAIT | SEEN_RECORD | SEEN_OUTBOX) != 0  # not facts alone
    mask = (
        _bit(~responder & shown, INITIATOR_END)
        .bitwiseOR(_bit(responder & shown, RESPONDER_END))
        .bitwiseOR(_bit(~responder & seen(SEEN_RECORD), INITIATOR_CONSUMED))
        .bitwiseOR(_bit(responder & seen(SEEN_RECORD), RESPONDER_CONSUMED))
        .bitwiseOR(_bit(~responder & seen(SEEN_OWN_WAIT), INITIATOR_WAITING))
        .bitwiseOR(_bit(responder & seen(SEEN_OWN_WAIT), RESPONDER_WAITING))
        .bitwiseOR(_bit(F.col("initiator_high").isin(analyzed), INITIATOR_ANALYZED))
        .bitwiseOR(_bit(F.col("responder_high").isin(analyzed), RESPONDER_ANALYZED))
        .bitwiseOR(_bit(F.col(ODD), UNUSUAL))
    )
    keyed = ends.select(
        F.col(CONVERSATION).alias("conversation"),
        mask.alias("mask"),
        *NODE_BOUNDS,
        INITIATOR_KEY,
        RESPONDER_KEY,
        # the end's own flow, when its node's export found it in its tables (a key looked up)
        F.when(~responder & seen(SEEN_OWN_KNOWN), F.col(INITIATOR_KEY)).alias("i_known"),
        F.when(responder & seen(SEEN_OWN_KNOWN), F.col(RESPONDER_KEY)).alias("r_known"),
        F.when(~responder, F.col("records")).alias("i_records"),
        F.when(~responder, F.col("top")).alias("i_top"),
        F.when(~responder, F.col("telescope")).alias("i_telescope"),
        F.when(responder, F.col("records")).alias("r_records"),
        F.when(responder, F.col("top")).alias("r_top"),
        F.when(responder, F.col("telescope")).alias("r_telescope"),
        F.when(~responder, F.col("sent")).alias("i_sent"),
        F.when(responder, F.col("sent")).alias("r_sent"),
    )
    return keyed.groupBy("conversation").agg(
        F.bit_or("mask").alias("mask"),
        F.min("initiator_low").alias("initiator_low"),
        F.max("initiator_high").alias("initiator_high"),
        F.min("responder_low").alias("responder_low"),
        F.max("responder_high").alias("responder_high"),
        F.max(INITIATOR_KEY).alias("initiator_key"),
        F.max(RESPONDER_KEY).alias("responder_key"),
        F.max("i_known").alias("i_known"),
        F.max("r_known").alias("r_known"),
        F.coalesce(F.sum("i_records"), F.lit(0)).alias("i_records"),
        F.max("i_top").alias("i_top"),
        F.bit_xor("i_telescope").alias("i_telescope"),
        F.coalesce(F.sum("r_records"), F.lit(0)).alias("r_records"),
        F.max("r_top").alias("r_top"),
        F.bit_xor("r_telescope").alias("r_telescope"),
        *[F.min(f"{side}_sent").alias(f"{side}_sent") for side in "ir"],
    )


def _next(number: Column) -> Column:
    """``number + 1``, null for the largest (no overflow error: the row is unusual)."""
    from pyspark.sql import functions as F

    return F.when(number < MAX_SEQUENCE, number + 1)


def _has(flag: int) -> Column:
    from pyspark.sql import functions as F

    return F.col("mask").bitwiseAND(F.lit(flag)) != 0


def _gapless(records: str, top: str, telescope: str) -> Column:
    """An end's consumed sequence numbers are exactly ``0..top``, once each (or none)."""
    from pyspark.sql import functions as F

    zero = F.xxhash64(F.lit(0).cast("bigint"))
    after = _next(F.col(top))
    whole = (F.col(records) == after) & (F.col(telescope) == zero.bitwiseXOR(F.xxhash64(after)))
    return (F.col(records) == 0) | F.coalesce(whole, F.lit(False))


def _unsent(conversations: DataFrame) -> Column:
    """A message consumed at or past what the other end's flow says it sent.

    (A message an end's own flow took in without a record made the end odd already.)
    """
    from pyspark.sql import functions as F

    def unsent(sent: str, top: str) -> Column:
        return F.coalesce(F.col(top) >= F.col(sent), F.lit(False))

    return unsent("i_sent", "r_top") | unsent("r_sent", "i_top")


def _judged(conversations: DataFrame) -> DataFrame:
    """The conversations with what they need: ``lookup_*`` keys to look up, ``unusual``."""
    from pyspark.sql import functions as F

    need_initiator = (_has(RESPONDER_END) & _has(INITIATOR_ANALYZED)) | _has(INITIATOR_CONSUMED)
    need_responder = (_has(INITIATOR_END) & _has(RESPONDER_ANALYZED)) | _has(RESPONDER_CONSUMED)
    # (null bounds: a conversation only facts show; its flows' facts are judged below)
    unusual = (
        _has(UNUSUAL)
        | F.coalesce(F.col("initiator_low") != F.col("initiator_high"), F.lit(False))
        | F.coalesce(F.col("responder_low") != F.col("responder_high"), F.lit(False))
        | ~_gapless("i_records", "i_top", "i_telescope")
        | ~_gapless("r_records", "r_top", "r_telescope")
        | (need_initiator & F.col("initiator_key").isNull())
        | (need_responder & F.col("responder_key").isNull())
        | _unsent(conversations)
    )
    # a flow its own node's export found (the very key the conversation names) is known
    initiator_known = F.coalesce(F.col("i_known") == F.col("initiator_key"), F.lit(False))
    responder_known = F.coalesce(F.col("r_known") == F.col("responder_key"), F.lit(False))
    return conversations.select(
        "conversation",
        "mask",
        "initiator_key",
        "responder_key",
        (need_initiator & ~_has(INITIATOR_WAITING) & ~initiator_known).alias("lookup_initiator"),
        (need_responder & ~_has(RESPONDER_WAITING) & ~responder_known).alias("lookup_responder"),
        F.coalesce(unusual, F.lit(True)).alias("unusual"),
    )


@contextmanager
def _without_partial_aggregation(snapshot: Snapshot) -> Iterator[None]:
    """Group without a partial aggregation before the shuffle, while in the block.

    Both of the screening's groupings (by conversation, by flow key) have nearly as many
    groups as rows, and a conversation's rows come from different files, so a partial
    aggregation before the shuffle would reduce nothing and cost a second hash table of every
    key (Spark's ``spark.sql.execution.bypassPartialAggregation``). Not for the small
    groupings of the other checks, nor for an aggregate without grouping keys.
    """
    conf = snapshot.spark.conf
    key = "spark.sql.execution.bypassPartialAggregation"
    before = conf.get(key, None)
    conf.set(key, "true")
    try:
        yield
    finally:
        if before is None:
            conf.unset(key)
        else:
            conf.set(key, before)


def _whole(snapshot: Snapshot) -> Screen:
    """The "screening" of a small snapshot: every conversation a candidate, the overlaps."""
    from pyspark.sql import functions as F

    empty = snapshot.spark.range(0).select(
        F.lit(None).cast("bigint").alias("conversation"),
        F.lit(None).cast("bigint").alias("initiator_key"),
        F.lit(None).cast("bigint").alias("responder_key"),
        F.lit(False).alias("lookup_initiator"),
        F.lit(False).alias("lookup_responder"),
        F.lit(True).alias("unusual"),
    )
    index = flow_index(snapshot, empty).localCheckpoint(eager=True)
    overlaps = overlaps_of(index)
    return Screen(
        conversations=0,
        candidates=None,
        candidate_count=0,
        ends_ok=0,
        ends_not_analyzed=0,
        consumed_owned=0,
        overlaps=overlaps,
        overlap_count=overlaps.count(),
        unpaired=unpaired_of(index),
    )


def _screen(snapshot: Snapshot, old_before: int) -> Screen:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    rows = sum(
        load.rows.get(t, 0) for load in snapshot.nodes for t in ("message_ids", "checkpoints")
    )
    if rows < SCREEN_ABOVE_ROWS:
        return _whole(snapshot)

    judged = _judged(_conversations(snapshot, old_before)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # small results are checkpointed: their (long) lineage would be planned, and printed
        # into every plan that uses them, again and again
        few = few_wanted(judged, MISSING_IN_DRIVER) if FLOWS in snapshot.layouts else None
        missing: DataFrame | None = None
        missing_keys: list[int] | None = None
        if few is not None:  # the export's flows read once, the needed keys as a set
            index, missing_keys = flow_index_of_few(snapshot.layouts[FLOWS], few)
            missing_count = len(missing_keys)
        else:
            with _without_partial_aggregation(snapshot):
                index = flow_index(snapshot, judged).localCheckpoint(eager=True)
            missing = index.where("missing").select(F.col("flow_key").alias("m_key"))
            missing_count = missing.count()
        overlaps = overlaps_of(index)
        overlap_count = overlaps.count()
        classified = judged
        if 0 < missing_count <= MISSING_IN_DRIVER:
            # a few keys: looked up in a set in every row (no join, nothing cached again)
            if missing_keys is not None:
                keys = missing_keys
            else:
                assert missing is not None
                keys = [row["m_key"] for row in missing.collect()]
            flagged = F.lit(False)
            for side in ("initiator", "responder"):
                flagged = flagged | (F.col(f"lookup_{side}") & F.col(f"{side}_key").isin(keys))
            classified = judged.withColumn("unusual", F.col("unusual") | flagged)
        elif missing_count:
            assert missing is not None  # more than MISSING_IN_DRIVER: the index's join found them
            small = F.broadcast(missing) if missing_count <= 200_000 else missing
            for side in ("initiator", "responder"):
                flag = F.col("m_key").isNotNull() & F.col(f"lookup_{side}")
                classified = (
                    classified.join(small, F.col(f"{side}_key") == F.col("m_key"), "left")
                    .withColumn("unusual", F.col("unusual") | F.coalesce(flag, F.lit(False)))
                    .drop("m_key")
                )
        initiator_ok = _has(INITIATOR_END) & _has(RESPONDER_ANALYZED)
        responder_ok = _has(RESPONDER_END) & _has(INITIATOR_ANALYZED)
        initiator_aside = _has(INITIATOR_END) & ~_has(RESPONDER_ANALYZED)
        responder_aside = _has(RESPONDER_END) & ~_has(INITIATOR_ANALYZED)

        def count(condition: Column) -> Column:
            return F.count(F.when(~F.col("unusual") & condition, True))

        joined = missing_count > MISSING_IN_DRIVER
        if joined:  # read twice below: the joins made once
            classified = classified.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            totals = classified.agg(
                F.count("*").alias("conversations"),
                F.count(F.when(F.col("unusual"), True)).alias("candidates"),
                (count(initiator_ok) + count(responder_ok)).alias("ok"),
                (count(initiator_aside) + count(responder_aside)).alias("aside"),
                (count(_has(INITIATOR_CONSUMED)) + count(_has(RESPONDER_CONSUMED))).alias("owned"),
                F.count(
                    F.when(F.col("unusual") & ~_has(INITIATOR_END) & ~_has(RESPONDER_END), True)
                ).alias("facts_only"),
            ).first()
            candidates = (
                classified.where("unusual").select("conversation").localCheckpoint(eager=True)
            )
        finally:
            if joined:
                classified.unpersist()
    finally:
        judged.unpersist()
    assert totals is not None
    return Screen(
        conversations=int(totals["conversations"]),
        candidates=candidates,
        candidate_count=int(totals["candidates"]),
        ends_ok=int(totals["ok"]),
        ends_not_analyzed=int(totals["aside"]),
        consumed_owned=int(totals["owned"]),
        overlaps=overlaps,
        overlap_count=overlap_count,
        unpaired=unpaired_of(index),
        missing_flows=missing_count,
        facts_only=int(totals["facts_only"]),
    )
