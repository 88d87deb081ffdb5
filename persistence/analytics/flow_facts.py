"""The facts of each flow's sessions its rows keep: the ``facts`` column, and the rules on it.

Every checkpoint, result and exception row of a node (schema version 9) keeps, in
``session_facts``, one JSON object per session of its flow: how many messages the flow sent
on it, how many it took in (in order, each with its dedup id) and whether the peer's
responder confirmed it (:mod:`statemachine.session_facts`; docs/schema.md). They outlive the
checkpoint blob, so the checks can judge a conversation whose two flows have both finished:

* :func:`consumed_unsent`: a dedup id for message ``k`` of a session whose sender's flow
  (live or finished) says it sent ``k`` messages or fewer on it: a record nobody sent;
* :func:`missing_last`: a flow says it took in ``n`` messages of a session and its node has
  no dedup id for one of them above the last it has (below it: the audit's gap);
* :func:`confirmations`: whether an initiating flow saw the peer's responder confirm a
  session, which session consistency tells a lost responder from a refusal by.

The text is parsed once, into :data:`FACTS` (``array<struct<session, sent, received,
confirmed>>``): by the Parquet export in Python (:func:`arrow_facts`), else by Spark
(:func:`with_facts`) before the cache. Only text of exactly the form the node writes is
parsed (:data:`FACTS_PATTERN`); any other (a damaged row) gives null facts, in Python and in
Spark alike, and null facts (or rows written before version 9) judge nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from persistence.analytics.check_results import CheckSettings, as_of_ms, shared
from persistence.analytics.session_columns import (
    conversation_key,
    expected_message_id,
    is_responder,
    peer_session,
)

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import Column, DataFrame

    from persistence.analytics.snapshot import Snapshot

FACTS_TEXT = "session_facts"
"""The column of the facts as the node writes them (JSON text)."""
FACTS = "facts"
"""The parsed facts of a flow row: ``array<struct<session, sent, received, confirmed>>``."""
FACTS_DDL = "array<struct<session:string,sent:bigint,received:bigint,confirmed:boolean>>"
"""Spark's type of :data:`FACTS` as Spark parses it."""
FACT_FRAMES = {"checkpoints": "updated_at", "results": "completed_at", "exceptions": "failed_at"}
"""The frames whose rows keep facts, and the time each row was written."""
GAPS_LISTED = 1_000
"""At most this many messages of one session are ``missing_last_dedup_id`` findings."""

_STRING = r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"'
_NUMBER = "(?:0|[1-9][0-9]{0,17})"  # below 10**18: a 64-bit integer in Python and in Spark
_ENTRY = (
    rf'\{{"session":{_STRING},"sent":{_NUMBER},"received":{_NUMBER},'
    r'"confirmed":(?:true|false)\}'
)
FACTS_PATTERN = rf"\[(?:{_ENTRY}(?:,{_ENTRY})*)?\]"
"""The text the node writes (``persistence.sql_transaction.session_facts_text``), exactly:
the whole text must match, in Python (``fullmatch``) and in Spark (``^...\\z``)."""
_FACTS = re.compile(FACTS_PATTERN)


# --- parsing ----------------------------------------------------------------------------------


def with_facts(frame: DataFrame) -> DataFrame:
    """``frame`` (checkpoints, results or exceptions) with :data:`FACTS` parsed.

    A frame that has them already (the export's) is returned as is; one without the text
    column (an export of an earlier format) gets null facts.
    """
    from pyspark.sql import functions as F

    if FACTS in frame.columns:
        return frame
    if FACTS_TEXT not in frame.columns:
        return frame.withColumn(FACTS, F.lit(None).cast(FACTS_DDL))
    text = F.col(FACTS_TEXT)
    well_formed = F.coalesce(text.rlike(f"^{FACTS_PATTERN}\\z"), F.lit(False))
    return frame.withColumn(FACTS, F.when(well_formed, F.from_json(text, FACTS_DDL)))


def python_facts(text: str | None) -> list[dict[str, Any]] | None:
    """The facts of one row's text, as Spark parses them (None unless well formed)."""
    if text is None or _FACTS.fullmatch(text) is None:
        return None
    facts: list[dict[str, Any]] = json.loads(text)
    return facts


def arrow_facts_type() -> pyarrow.DataType:
    """The Arrow type of :data:`FACTS` in the export."""
    import pyarrow as pa

    return pa.list_(
        pa.struct(
            [
                ("session", pa.string()),
                ("sent", pa.int64()),
                ("received", pa.int64()),
                ("confirmed", pa.bool_()),
            ]
        )
    )


def arrow_facts(texts: Sequence[str | None]) -> pyarrow.Array:
    """The :data:`FACTS` array of rows, parsed in Python (the export)."""
    import pyarrow as pa

    return pa.array([python_facts(text) for text in texts], type=arrow_facts_type())


def fact_keys(fact: Column) -> tuple[Column, Column]:
    """(conversation key, responder's end) of a :data:`FACTS` element."""
    return conversation_key(fact["session"]), is_responder(fact["session"])


# --- the facts as rows ------------------------------------------------------------------------


def session_facts(snapshot: Snapshot) -> DataFrame:
    """One row per session in each flow's facts.

    Columns: ``node``, ``flow_id``, ``session_id``, ``sent``, ``received``, ``confirmed``
    and ``at`` (when the row was written). A finished flow's facts are its result's or
    error's; a live flow's its checkpoint's (a flow both finished and live, which node
    integrity reports, is judged by its outcome, as its node treats it). A shared frame:
    built and cached once per snapshot (the candidates' one, or a small whole one).
    """
    return shared(snapshot, "session_facts", lambda: _session_facts(snapshot))


def _session_facts(snapshot: Snapshot) -> DataFrame:
    from pyspark.sql import functions as F

    def exploded(name: str) -> DataFrame:
        frame = snapshot.frames[name]
        return frame.select(
            "node",
            "flow_id",
            F.col(FACT_FRAMES[name]).alias("at"),
            F.explode(FACTS).alias("f"),
        )

    finished = exploded("results").unionByName(exploded("exceptions"))
    ended = finished.select(F.col("node").alias("e_node"), F.col("flow_id").alias("e_flow"))
    live = exploded("checkpoints")
    live = live.join(
        ended.distinct(),
        (live.node == ended.e_node) & (live.flow_id == ended.e_flow),
        "left_anti",
    )
    return (
        finished.unionByName(live)
        .select(
            "node",
            "flow_id",
            F.col("f.session").alias("session_id"),
            F.col("f.sent").alias("sent"),
            F.col("f.received").alias("received"),
            F.coalesce(F.col("f.confirmed"), F.lit(False)).alias("confirmed"),
            "at",
        )
        .where(
            F.col("session_id").isNotNull()
            & F.col("sent").isNotNull()
            & F.col("received").isNotNull()
        )
    )


def confirmations(snapshot: Snapshot) -> DataFrame:
    """Whether the peer's responder confirmed each initiator end in a flow's facts.

    (``f_node``, ``f_session``, ``confirmed``): its first message, taken in.
    """
    from pyspark.sql import functions as F

    facts = session_facts(snapshot).where(~is_responder(F.col("session_id")))
    return facts.groupBy(F.col("node").alias("f_node"), F.col("session_id").alias("f_session")).agg(
        F.max("confirmed").alias("confirmed")
    )


# --- the exactly-once audit's rules -----------------------------------------------------------


def consumed_unsent(snapshot: Snapshot, settings: CheckSettings) -> DataFrame:
    """Dedup ids of messages their sender's flow says it never sent (audit findings).

    Node R recorded message ``k`` of its end of a session from X; X's flow holding the
    other end says (in its checkpoint row, or its result or error row once it ended) that it
    sent ``k`` messages or fewer on it. A flow's messages are written to its outbox in the
    transactions that write its row, so the row counts every message it ever sent: the
    record is of a message nobody sent (forged, or from a restored or foreign database).
    Records newer than ``grace_ms`` before *as of* are not judged (two snapshots may
    straddle a send).
    """
    from pyspark.sql import functions as F

    judged_before = as_of_ms(snapshot, settings) - settings.grace_ms
    ids = snapshot.message_ids.where(F.col("inserted_at") <= judged_before)
    sent = session_facts(snapshot).select(
        F.col("node").alias("s_node"),
        F.col("flow_id").alias("s_flow"),
        F.col("session_id").alias("s_session"),
        "sent",
    )
    found = ids.join(
        sent, (sent.s_node == ids.sender) & (sent.s_session == peer_session(ids.session_id))
    ).where(F.col("sequence") >= F.col("sent"))
    return found.select(
        "node",
        F.lit("consumed_unsent").alias("kind"),
        "session_id",
        "sequence",
        F.col("sender").alias("counterparty"),
        F.col("message_id").alias("message_ids"),
        F.col("inserted_at").alias("at"),
        F.concat(
            F.lit("message "),
            F.col("sequence").cast("string"),
            F.lit(" recorded as consumed, but its sender's flow "),
            F.col("s_flow"),
            F.lit(" says it sent "),
            F.col("sent").cast("string"),
            F.lit(" on "),
            F.col("s_session"),
            F.lit(": no flow sent it"),
        ).alias("detail"),
    )


def missing_last(snapshot: Snapshot) -> DataFrame:
    """Messages a flow took in with no dedup id, above its node's last one (audit findings).

    A flow's row says it took in ``n`` messages of a session (live: its checkpoint row;
    finished: its result or error row); each has its dedup id, written in the transaction
    that took it in, in the same node. One missing above the last recorded (or with none
    recorded) is a broken promise: a redelivery would be taken in again. A missing one below
    a recorded one is ``sequence_gap``. Both facts are of one node's one snapshot: no grace.
    At most :data:`GAPS_LISTED` a session.
    """
    from pyspark.sql import functions as F

    facts = session_facts(snapshot).where(F.col("received") > 0)
    ids = snapshot.message_ids.where(F.col("sequence") >= 0)
    top = ids.groupBy(F.col("node").alias("t_node"), F.col("session_id").alias("t_session")).agg(
        F.max("sequence").alias("top"), F.max("sender").alias("sender")
    )
    received, recorded = F.col("received"), F.col("top")
    ends = facts.join(
        top, (top.t_node == facts.node) & (top.t_session == facts.session_id), "left"
    ).where(received - 1 > F.coalesce(recorded, F.lit(-1).cast("bigint")))
    # (a record numbered near 2**63 is above every count: never one more than it, no overflow)
    ends = ends.withColumn(
        "first",
        F.when(recorded.isNull(), F.lit(0).cast("bigint")).when(recorded < received, recorded + 1),
    )
    last = F.least(received - 1, F.col("first") + GAPS_LISTED - 1)
    missing = ends.select(
        "node",
        "flow_id",
        "session_id",
        "sender",
        "received",
        "at",
        F.explode(F.sequence(F.col("first"), last)).alias("sequence"),
    )
    return missing.select(
        "node",
        F.lit("missing_last_dedup_id").alias("kind"),
        "session_id",
        "sequence",
        F.col("sender").alias("counterparty"),
        expected_message_id(peer_session(F.col("session_id")), F.col("sequence")).alias(
            "message_ids"
        ),
        "at",
        F.concat(
            F.lit("message "),
            F.col("sequence").cast("string"),
            F.lit(" was taken in by flow "),
            F.col("flow_id"),
            F.lit(" (it says it took in "),
            F.col("received").cast("string"),
            F.lit("), but the node has no dedup id for it: a redelivery would be taken in again"),
        ).alias("detail"),
    )
