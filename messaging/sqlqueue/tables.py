"""The SQL queue's tables (one set per queue database, shared by every node using it).

* ``ff_queues``: one row per node queue (its address); a send to an address without a row
  raises :class:`~messaging.service.TransportError` (the target has never started).
* ``ff_queue_messages``: the messages, as frames (:mod:`messaging.frame`), one row per send
  (even one that repeats a message id: the receiving node drops duplicates by id only after
  checking who sent them, so a forged message can never stand in for a genuine one), with the
  lease of the consumer that claimed it (``lease_owner``, ``lease_until``) and the partition
  of the receiving node's flows it is for (``partition``, :mod:`statemachine.partitions`,
  computed by the sender from the message's id and sender; null for a row an older sender
  wrote): a worker of a node run by several workers claims only its partitions' rows.
* ``ff_queue_dead_letters``: frames that could not be decoded, were over the frame limit or
  had a topic no handler takes, with the reason (a bounded copy: writing it never fails on
  what the message holds).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from statemachine.limits import QUEUE_MESSAGE_ID_CHARS, QUEUE_NAME_CHARS

metadata = MetaData()
PARTITION_INDEX = "ff_queue_messages_partition_claim"
"""The index a worker's claim of some partitions of its queue uses."""
_ROW_ID = BigInteger().with_variant(Integer, "sqlite")  # INTEGER PRIMARY KEY is SQLite's rowid

queues = Table(
    "ff_queues",
    metadata,
    Column("name", String(QUEUE_NAME_CHARS), primary_key=True),
    Column("created_at", BigInteger, nullable=False),
)

queue_messages = Table(
    "ff_queue_messages",
    metadata,
    Column("id", _ROW_ID, primary_key=True, autoincrement=True),
    Column("queue", String(QUEUE_NAME_CHARS), nullable=False),
    Column("message_id", String(QUEUE_MESSAGE_ID_CHARS), nullable=True),
    Column("frame", LargeBinary, nullable=False),
    Column("enqueued_at", BigInteger, nullable=False),
    Column("lease_owner", String(64), nullable=True),
    Column("lease_until", BigInteger, nullable=True),
    Column("deliveries", Integer, nullable=False, default=0),
    Column("partition", Integer, nullable=True),
    Index("ff_queue_messages_claim", "queue", "id"),
    Index(PARTITION_INDEX, "queue", "partition", "id"),
    # A send never reads the new row back: a peer's role may insert without reading
    # (messaging.sqlqueue.peer_roles), which a RETURNING clause would need.
    implicit_returning=False,
)

queue_dead_letters = Table(
    "ff_queue_dead_letters",
    metadata,
    Column("id", _ROW_ID, primary_key=True, autoincrement=True),
    Column("queue", String(QUEUE_NAME_CHARS), nullable=False),
    Column("message_id", String(QUEUE_MESSAGE_ID_CHARS), nullable=True),
    Column("frame", LargeBinary, nullable=False),
    Column("reason", Text, nullable=False),
    Column("dead_lettered_at", BigInteger, nullable=False),
)
