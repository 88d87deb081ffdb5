"""The SQL queue's broker: what one queue database does for every node that shares it.

A send commits its rows before returning (that commit is the "durably taken"); every send is
a row of its own (:mod:`messaging.sqlqueue.tables`). A consumer *claims* rows by leasing them
(``lease_owner``, ``lease_until``): on PostgreSQL with ``SELECT ... FOR UPDATE SKIP LOCKED``,
on SQLite under the database write lock. It claims by bytes as well as by rows: it first reads
the candidates' ids and frame lengths (never their frames), then leases the oldest ones whose
frames add up to at most ``CLAIM_BYTES`` (always at least one). A row over the frame limit is
dead-lettered without its frame entering the node: moved whole inside the database on
PostgreSQL; on SQLite, whose engine runs inside the node's process, only its first
``limits.DEAD_LETTER_PREFIX_BYTES`` are copied, read through SQLite's incremental blob I/O.
Acknowledging a delivery deletes its row (its ``receipt`` is the row id), no other. Leases
expire after the consumer's lease time (then the messages are delivered again); a consumer
that stops cleanly gives its leases back, and a node that took over from a dead process
releases that process's leases at once (:meth:`SqlQueueBroker.release_leases`). A starting
consumer never takes the leases of a live one.

Waking: on PostgreSQL a send issues ``NOTIFY`` on the queue's channel
(:func:`notify_channel`); on SQLite it sends a datagram to the queue's consumer in another
process (:mod:`messaging.sqlqueue.wakeups`); a send from the same process also sets the
queue's :func:`local_wakeup` event, which a consumer in this process waits on.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

import attrs
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    LargeBinary,
    and_,
    bindparam,
    delete,
    func,
    insert,
    inspect,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from foundation.bounded import bounded_reason, bounded_text
from foundation.engine import create_tables, normalize_url, open_engine, write_engine
from messaging.frame import MAX_FRAME_BYTES, encode_frame, oversized_problem
from messaging.service import Message, TransportError
from messaging.sqlqueue.tables import (
    PARTITION_INDEX,
    metadata,
    queue_dead_letters,
    queue_messages,
    queues,
)
from messaging.sqlqueue.wakeups import poke
from statemachine.limits import DEAD_LETTER_PREFIX_BYTES, QUEUE_MESSAGE_ID_CHARS
from statemachine.partitions import partition_of_message

log = logging.getLogger("fiberflow.sqlqueue")

CLAIM_BATCH = 200
"""Most messages claimed per query."""
CLAIM_BYTES = 4 * 1024 * 1024
"""Most frame bytes claimed per query (but always one message, if one is within the limit)."""

_local_wakeups: dict[tuple[str, str], threading.Event] = {}
_local_wakeups_lock = threading.Lock()


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def notify_channel(queue: str) -> str:
    """The PostgreSQL NOTIFY channel of a queue (a short, safe identifier)."""
    return "ffq_" + hashlib.sha256(queue.encode()).hexdigest()[:24]


def local_wakeup(url: str, queue: str) -> threading.Event:
    """The event a send from this process sets for ``queue`` of the database at ``url``."""
    with _local_wakeups_lock:
        return _local_wakeups.setdefault((url, queue), threading.Event())


@attrs.frozen
class Claim:
    """What one claim took.

    The leased (row id, frame) pairs, oldest first, and how many rows over the frame limit it
    moved to the dead letters instead.
    """

    rows: tuple[tuple[int, bytes], ...]
    dead_lettered: int = 0


def _take_prefix(
    candidates: Sequence[tuple[int, int]], max_bytes: int, max_frame_bytes: int
) -> tuple[list[int], list[tuple[int, int]]]:
    """Split (row id, frame size) candidates, oldest first, into ids to lease and oversized.

    The ids to lease are the longest prefix of those within the frame limit whose sizes add up
    to ``max_bytes`` (and at least one); the others returned are the (id, size) of those over
    the frame limit.
    """
    chosen: list[int] = []
    oversized: list[tuple[int, int]] = []
    total = 0
    full = False
    for row_id, size in candidates:
        if size > max_frame_bytes:
            oversized.append((row_id, size))
        elif not full and (not chosen or total + size <= max_bytes):
            chosen.append(row_id)
            total += size
        else:
            full = True
    return chosen, oversized


def _sqlite_blob_prefix(connection: Connection, row_id: int, size: int) -> bytes:
    """The first ``size`` bytes of a queue row's frame, read without loading the rest."""
    driver: sqlite3.Connection = connection.connection.driver_connection  # type: ignore[assignment]
    with driver.blobopen(queue_messages.name, "frame", row_id, readonly=True) as blob:
        return blob.read(size)


def _candidates(postgres: bool, routing: str) -> Any:
    """Visible messages of a queue, oldest first: (row id, frame length), built once.

    ``routing``: ``all`` partitions; ``some`` (those in the ``partitions`` parameter); or
    ``some+unrouted``, which adds the rows without a partition (written by older senders).
    """
    table = queue_messages
    now: Any = bindparam("now")
    conditions = [
        table.c.queue == bindparam("queue"),
        or_(table.c.lease_until.is_(None), table.c.lease_until < now),
    ]
    if routing != "all":
        chosen = table.c.partition.in_(bindparam("partitions", expanding=True))
        conditions.append(
            or_(chosen, table.c.partition.is_(None)) if routing == "some+unrouted" else chosen
        )
    query = (
        select(table.c.id, func.length(table.c.frame))
        .where(and_(*conditions))
        .order_by(table.c.id)
        .limit(bindparam("limit"))
    )
    return query.with_for_update(skip_locked=True) if postgres else query


_CANDIDATES = {
    (postgres, routing): _candidates(postgres, routing)
    for postgres in (False, True)
    for routing in ("all", "some", "some+unrouted")
}
"""The claim's candidates by (PostgreSQL?, routing): on PostgreSQL locked, skipping rows
another consumer has locked."""
_LEASE = (
    update(queue_messages)
    .where(queue_messages.c.id.in_(bindparam("ids", expanding=True)))
    .values(
        lease_owner=bindparam("owner"),
        lease_until=bindparam("until"),
        deliveries=queue_messages.c.deliveries + 1,
    )
    .returning(queue_messages.c.id, queue_messages.c.frame)
)
"""Lease the chosen rows; returns their frames."""
_ACKNOWLEDGE = delete(queue_messages).where(
    queue_messages.c.queue == bindparam("queue"),
    queue_messages.c.id.in_(bindparam("ids", expanding=True)),
)
"""Delete acknowledged deliveries of a queue, by row id."""


class SqlQueueBroker:
    """The queue tables of one database: enqueue, claim, acknowledge, dead-letter."""

    def __init__(
        self, url: str, *, synchronous: str = "FULL", application_name: str | None = None
    ) -> None:
        """Open the queue tables at ``url`` (creating them if new).

        ``application_name`` names the connections on PostgreSQL (a node's consumer uses its
        worker's, so that a node taking over from a frozen process can end them).
        """
        self.url = normalize_url(url)
        engine = open_engine(self.url, synchronous=synchronous, application_name=application_name)
        self.dialect = engine.dialect.name
        if self.dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"the SQL queue runs on SQLite or PostgreSQL, not {self.dialect}")
        self.engine: Engine = engine
        self._known_queues: set[str] = set()
        create_tables(engine, metadata)
        self._drop_old_unique_index()
        self._add_partition_column()

    def _drop_old_unique_index(self) -> None:
        """Queue tables made by earlier versions had a unique (queue, message id) index.

        Messages are told apart by delivery (row id), not by id: a unique id let a forged
        message with a genuine message's id make the genuine send a silent no-op.
        """
        if "ff_queue_messages_unique" not in {
            index["name"] for index in inspect(self.engine).get_indexes("ff_queue_messages")
        }:
            return
        with contextlib.suppress(SQLAlchemyError), self.engine.begin() as connection:
            connection.execute(text("DROP INDEX IF EXISTS ff_queue_messages_unique"))

    def _add_partition_column(self) -> None:
        """Queue tables made by earlier versions have no ``partition`` column: add it.

        Their rows keep a null partition: the consumer that takes unrouted rows routes them
        (see :meth:`give_back`).
        """
        columns = {
            column["name"] for column in inspect(self.engine).get_columns("ff_queue_messages")
        }
        if "partition" in columns:
            return
        with contextlib.suppress(SQLAlchemyError), self.engine.begin() as connection:
            connection.execute(text('ALTER TABLE ff_queue_messages ADD COLUMN "partition" INTEGER'))
            connection.execute(
                text(
                    f"CREATE INDEX IF NOT EXISTS {PARTITION_INDEX} "
                    'ON ff_queue_messages (queue, "partition", id)'
                )
            )

    def create_queue(self, name: str) -> None:
        """Make sure queue ``name`` exists."""
        module: Any = sqlite if self.dialect == "sqlite" else postgresql
        with self.engine.begin() as connection:
            connection.execute(
                module.insert(queues)
                .values(name=name, created_at=_ms(time.time()))
                .on_conflict_do_nothing(index_elements=["name"])
            )
        self._known_queues.add(name)

    def _check_targets(self, targets: set[str]) -> None:
        unknown = targets - self._known_queues
        if not unknown:
            return
        with self.engine.connect() as connection:
            found = set(
                connection.execute(select(queues.c.name).where(queues.c.name.in_(unknown)))
                .scalars()
                .all()
            )
        self._known_queues |= found
        missing = unknown - found
        if missing:
            raise TransportError(
                f"no queue for {', '.join(sorted(missing))} in {self._safe_url()} "
                "(that node has never started on this queue database)"
            )

    def _safe_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def enqueue(self, items: Sequence[tuple[Message, str]]) -> None:
        """Commit every (message, target) pair in one transaction (duplicates stored once)."""
        if not items:
            return
        targets = {target for _, target in items}
        try:
            self._check_targets(targets)
            now = _ms(time.time())
            rows = [
                {
                    "queue": target,
                    "message_id": message.message_id,
                    "frame": encode_frame(message),
                    "enqueued_at": now,
                    "deliveries": 0,
                    "partition": partition_of_message(message.message_id, message.sender),
                }
                for message, target in items
            ]
            # Every send is a row of its own, re-sends included: the receiver drops
            # duplicates by id once it has checked who sent them.
            with self.engine.begin() as connection:
                connection.execute(insert(queue_messages), rows)
                if self.dialect == "postgresql":
                    for target in sorted(targets):
                        connection.execute(
                            text("SELECT pg_notify(:channel, '')"),
                            {"channel": notify_channel(target)},
                        )
        except SQLAlchemyError as error:
            raise TransportError(f"queue database refused the messages: {error}") from error
        for target in targets:
            local_wakeup(self.url, target).set()
            if self.dialect == "sqlite":
                poke(self.url, target)

    def insert_raw(self, queue: str, raw: bytes) -> None:
        """Store raw bytes in ``queue`` as if a broken sender had sent them (tests, tools)."""
        with self.engine.begin() as connection:
            connection.execute(
                insert(queue_messages).values(
                    queue=queue, message_id=None, frame=raw, enqueued_at=_ms(time.time())
                )
            )
        local_wakeup(self.url, queue).set()
        if self.dialect == "sqlite":
            poke(self.url, queue)

    def release_leases(self, queue: str, owners: Sequence[str]) -> int:
        """Make the deliveries ``owners`` hold on ``queue`` visible again; returns how many.

        For consumers known to be gone (a node that took over from a dead process, or a
        consumer stopping cleanly): a live consumer's leases are never released here, they
        expire.
        """
        if not owners:
            return 0
        with self.engine.begin() as connection:
            result = connection.execute(
                update(queue_messages)
                .where(queue_messages.c.queue == queue, queue_messages.c.lease_owner.in_(owners))
                .values(lease_owner=None, lease_until=None)
            )
        return int(result.rowcount)

    def claim(
        self,
        queue: str,
        owner: str,
        limit: int,
        lease_seconds: float,
        *,
        max_bytes: int = CLAIM_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        acknowledged: Sequence[int] = (),
        partitions: frozenset[int] | None = None,
        take_unrouted: bool = True,
    ) -> Claim:
        """Lease visible messages of ``queue``, oldest first, by count and by bytes.

        At most ``limit`` of them and ``max_bytes`` of frames, but at least one if one is
        within ``max_frame_bytes``. Frames are only loaded for the rows leased. A candidate
        over ``max_frame_bytes`` is dead-lettered instead, in the same transaction, without
        its frame leaving the database (see the module docstring). The ``acknowledged``
        deliveries are deleted first, in the same transaction (see :meth:`acknowledge`): a
        consumer's acknowledgements and its next claim cost one commit.

        ``partitions``: only rows of these partitions (None: every row); with
        ``take_unrouted``, rows without a partition too.
        """
        now = _ms(time.time())
        postgres = self.dialect == "postgresql"
        parameters: dict[str, Any] = {"queue": queue, "now": now, "limit": limit}
        if partitions is None:
            routing = "all"
        else:
            routing = "some+unrouted" if take_unrouted else "some"
            parameters["partitions"] = sorted(partitions)
        with self._write_engine().begin() as connection:
            self._delete_acknowledged(connection, queue, acknowledged)
            found = connection.execute(_CANDIDATES[postgres, routing], parameters)
            chosen, oversized = _take_prefix(
                [(int(row_id), int(size)) for row_id, size in found],
                max_bytes,
                max_frame_bytes,
            )
            for row_id, size in oversized:
                self._dead_letter_oversized(connection, row_id, size, max_frame_bytes, now)
            rows: list[tuple[int, bytes]] = []
            if chosen:
                leased = connection.execute(
                    _LEASE,
                    {"ids": chosen, "owner": owner, "until": now + _ms(lease_seconds)},
                )
                rows = [(int(r[0]), bytes(r[1])) for r in leased]
        rows.sort()
        return Claim(tuple(rows), len(oversized))

    def _write_engine(self) -> Engine:
        """The engine for a transaction that reads before it writes (IMMEDIATE on SQLite)."""
        return write_engine(self.engine)

    def _dead_letter_oversized(
        self, connection: Connection, row_id: int, size: int, limit: int, now: int
    ) -> None:
        """Move a row whose frame is over ``limit`` to the dead letters, never loading it here."""
        reason = oversized_problem(size, limit)
        source = queue_messages
        message_id = func.substr(source.c.message_id, 1, QUEUE_MESSAGE_ID_CHARS)
        if self.dialect == "postgresql":  # copied inside the database server, whole
            connection.execute(
                insert(queue_dead_letters).from_select(
                    ["queue", "message_id", "frame", "reason", "dead_lettered_at"],
                    select(
                        source.c.queue,
                        message_id,
                        source.c.frame,
                        literal(bounded_reason(reason)),
                        literal(now, BigInteger),
                    ).where(source.c.id == row_id),
                )
            )
        else:  # SQLite runs in this process: copy a bounded prefix, by incremental blob I/O
            prefix = _sqlite_blob_prefix(connection, row_id, DEAD_LETTER_PREFIX_BYTES)
            reason = f"{reason}; only its first {len(prefix)} bytes are kept"
            connection.execute(
                insert(queue_dead_letters).from_select(
                    ["queue", "message_id", "frame", "reason", "dead_lettered_at"],
                    select(
                        source.c.queue,
                        message_id,
                        literal(prefix, LargeBinary),
                        literal(bounded_reason(reason)),
                        literal(now, BigInteger),
                    ).where(source.c.id == row_id),
                )
            )
        connection.execute(delete(source).where(source.c.id == row_id))
        log.warning("dead-lettering stored message %d: %s", row_id, reason)

    def give_back(self, queue: str, row_id: int, owner: str, partition: int | None = None) -> bool:
        """End ``owner``'s lease on a delivery without settling it: it is claimed again.

        With ``partition`` the row is routed to that partition (a delivery of a partition its
        consumer does not take, or a row an older sender wrote without one). True if the row
        was still leased by ``owner``.
        """
        values: dict[str, Any] = {"lease_owner": None, "lease_until": None}
        if partition is not None:
            values["partition"] = partition
        with self.engine.begin() as connection:
            result = connection.execute(
                update(queue_messages)
                .where(
                    queue_messages.c.queue == queue,
                    queue_messages.c.id == row_id,
                    queue_messages.c.lease_owner == owner,
                )
                .values(**values)
            )
            if self.dialect == "postgresql":  # the partition's consumer may be elsewhere
                connection.execute(
                    text("SELECT pg_notify(:channel, '')"), {"channel": notify_channel(queue)}
                )
        local_wakeup(self.url, queue).set()
        return bool(result.rowcount)

    def acknowledge(self, queue: str, row_ids: Sequence[int]) -> None:
        """Delete acknowledged deliveries (by row: other copies of the same id stay)."""
        with self.engine.begin() as connection:
            self._delete_acknowledged(connection, queue, row_ids)

    @staticmethod
    def _delete_acknowledged(connection: Connection, queue: str, row_ids: Sequence[int]) -> None:
        for start in range(0, len(row_ids), 500):
            chunk = list(row_ids[start : start + 500])
            connection.execute(_ACKNOWLEDGE, {"queue": queue, "ids": chunk})

    def dead_letter(
        self, queue: str, row_id: int, raw: bytes, reason: str, message_id: str | None = None
    ) -> None:
        """Move one stored message to the dead letters, with the reason (one transaction).

        The message id (when known) and the reason are stored as bounded copies
        (:mod:`foundation.bounded`), so this never fails because of what the message holds.
        """
        with self.engine.begin() as connection:
            connection.execute(
                insert(queue_dead_letters).values(
                    queue=queue,
                    message_id=(
                        None
                        if message_id is None
                        else bounded_text(message_id, QUEUE_MESSAGE_ID_CHARS)
                    ),
                    frame=raw,
                    reason=bounded_reason(reason),
                    dead_lettered_at=_ms(time.time()),
                )
            )
            connection.execute(delete(queue_messages).where(queue_messages.c.id == row_id))

    def dead_letters(self, queue: str) -> list[tuple[bytes, str]]:
        """(frame, reason) of each dead letter of ``queue``, oldest first."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(queue_dead_letters.c.frame, queue_dead_letters.c.reason)
                .where(queue_dead_letters.c.queue == queue)
                .order_by(queue_dead_letters.c.id)
            )
            return [(bytes(frame), reason) for frame, reason in rows]

    def dead_letter_summaries(self, queue: str) -> list[tuple[int, str]]:
        """(stored frame size, reason) of each dead letter of ``queue``, oldest first.

        The frames themselves are not loaded.
        """
        table = queue_dead_letters
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(func.length(table.c.frame), table.c.reason)
                .where(table.c.queue == queue)
                .order_by(table.c.id)
            )
            return [(int(size), reason) for size, reason in rows]

    def unclaimed(self, queue: str) -> int:
        """Messages in ``queue`` that no consumer holds a live lease on."""
        now = _ms(time.time())
        with self.engine.connect() as connection:
            return int(
                connection.execute(
                    select(func.count(queue_messages.c.id)).where(
                        queue_messages.c.queue == queue,
                        or_(
                            queue_messages.c.lease_until.is_(None),
                            queue_messages.c.lease_until < now,
                        ),
                    )
                ).scalar_one()
            )

    def leases(self, queue: str) -> list[tuple[int, str | None]]:
        """(row id, owner of its live lease or None) of each message in ``queue``, oldest first.

        One snapshot, frames not loaded: what a consumer has claimed and what is still to come
        (see :meth:`~messaging.sqlqueue.consumer.SqlQueueMessaging.drained`).
        """
        now = _ms(time.time())
        table = queue_messages
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(table.c.id, table.c.lease_owner, table.c.lease_until)
                .where(table.c.queue == queue)
                .order_by(table.c.id)
            )
            return [
                (int(row_id), owner if until is not None and until >= now else None)
                for row_id, owner, until in rows
            ]

    def depth(self, queue: str) -> int:
        """Messages stored in ``queue`` (leased or not)."""
        with self.engine.connect() as connection:
            return int(
                connection.execute(
                    select(func.count(queue_messages.c.id)).where(queue_messages.c.queue == queue)
                ).scalar_one()
            )

    def purge(self, queue: str) -> None:
        """Delete queue ``name`` and everything in it (tests and tools)."""
        with self.engine.begin() as connection:
            for table in (queue_messages, queue_dead_letters):
                connection.execute(delete(table).where(table.c.queue == queue))
            connection.execute(delete(queues).where(queues.c.name == queue))
        self._known_queues.discard(queue)

    def listen_connection(self, queue: str) -> Any:
        """A psycopg connection LISTENing on ``queue``'s channel (PostgreSQL only)."""
        import psycopg

        conninfo = (
            make_url(self.url).set(drivername="postgresql").render_as_string(hide_password=False)
        )
        connection = psycopg.connect(conninfo, autocommit=True)
        connection.execute(f"LISTEN {notify_channel(queue)}")
        return connection

    def close(self) -> None:
        """Release every connection."""
        self.engine.dispose()
