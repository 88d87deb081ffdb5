"""The SQL queue: durable message queues in database tables (the embedded default transport).

One queue database serves every node that shares it: a SQLite file for the nodes of one host
(the embedded default), or a PostgreSQL database for nodes on many hosts. Tables:

* ``ff_queues``: one row per node queue (its address); a send to an address without a row
  raises :class:`~messaging.service.TransportError` (the target has never started).
* ``ff_queue_messages``: the messages, as frames (:mod:`messaging.frame`). A send commits
  its rows before returning (that commit is the "durably taken"). Every send is a row of its
  own, even one that repeats a message id: the receiving node drops duplicates by id only
  after checking who sent them, so a forged message can never stand in for a genuine one.
  A consumer *claims* rows by leasing them (``lease_owner``, ``lease_until``): on PostgreSQL
  with ``SELECT ... FOR UPDATE SKIP LOCKED``, on SQLite under the database write lock. It
  claims by bytes as well as by rows: it first reads the candidates' ids and frame lengths
  (never their frames), then leases the oldest ones whose frames add up to at most
  ``CLAIM_BYTES`` (always at least one). A row over the frame limit is dead-lettered without
  its frame entering the node: moved whole inside the database on PostgreSQL; on SQLite, whose
  engine runs inside the node's process, only its first ``limits.DEAD_LETTER_PREFIX_BYTES``
  are copied, read through SQLite's incremental blob I/O.
  Acknowledging a delivery deletes its row (its ``receipt`` is the row id), no other. A
  consumer's leases expire after ``lease_seconds`` (then the messages are delivered again);
  a consumer that stops cleanly gives its leases back, and a node that took over from a dead
  process releases that process's leases at once (:meth:`SqlQueueMessaging.release_deliveries_of`).
  A starting consumer never takes the leases of a live one.
* ``ff_queue_dead_letters``: frames that could not be decoded, were over the frame limit or
  had a topic no handler takes, with the reason (a bounded copy: writing it never fails on
  what the message holds).

Back-pressure: a consumer holds at most ``window`` deliveries (2,000 by default, like the AMQP
prefetch) and ``window_bytes`` of frames (64 MiB, plus at most one frame) handed to the node and
not yet acknowledged; it claims nothing more until acknowledgements make room.

Waking: on PostgreSQL a send issues ``NOTIFY`` and the consumer ``LISTEN``s (with a slow poll
as a safety net); on SQLite the consumer polls adaptively, from 1 ms after a message to
50 ms when idle, and a send from the same process wakes it at once.

Acknowledgements are buffered and deleted in batches by the consumer thread: an
acknowledgement lost in a crash only means a redelivery, which the node drops by its id.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
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

from messaging.frame import (
    MAX_FRAME_BYTES,
    MalformedFrameError,
    decode_frame,
    encode_frame,
    oversized_problem,
)
from messaging.service import Message, MessageHandler, TransportError
from persistence.bounded import bounded_reason, bounded_text
from persistence.engine import create_tables, normalize_url, open_engine, write_engine
from persistence.lease import application_name
from statemachine.limits import (
    DEAD_LETTER_PREFIX_BYTES,
    QUEUE_MESSAGE_ID_CHARS,
    QUEUE_NAME_CHARS,
)

log = logging.getLogger("fiberflow.sqlqueue")

metadata = MetaData()
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
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("queue", String(QUEUE_NAME_CHARS), nullable=False),
    Column("message_id", String(QUEUE_MESSAGE_ID_CHARS), nullable=True),
    Column("frame", LargeBinary, nullable=False),
    Column("enqueued_at", BigInteger, nullable=False),
    Column("lease_owner", String(64), nullable=True),
    Column("lease_until", BigInteger, nullable=True),
    Column("deliveries", Integer, nullable=False, default=0),
    Index("ff_queue_messages_claim", "queue", "id"),
)

queue_dead_letters = Table(
    "ff_queue_dead_letters",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("queue", String(QUEUE_NAME_CHARS), nullable=False),
    Column("message_id", String(QUEUE_MESSAGE_ID_CHARS), nullable=True),
    Column("frame", LargeBinary, nullable=False),
    Column("reason", Text, nullable=False),
    Column("dead_lettered_at", BigInteger, nullable=False),
)

CLAIM_BATCH = 200
"""Most messages claimed per query."""
CLAIM_BYTES = 4 * 1024 * 1024
"""Most frame bytes claimed per query (but always one message, if one is within the limit)."""
DEFAULT_WINDOW = 2000
"""Deliveries a consumer holds unacknowledged before it stops claiming (as the AMQP prefetch)."""
DEFAULT_WINDOW_BYTES = 64 * 1024 * 1024
"""Frame bytes a consumer holds unacknowledged before it stops claiming (it may go over by one
claim's first frame, so at most this plus one frame)."""
MIN_POLL_SECONDS = 0.001
MAX_POLL_SECONDS = 0.05
"""Adaptive polling bounds on SQLite (PostgreSQL waits for NOTIFY, polling at most each 1 s)."""
LISTEN_POLL_SECONDS = 1.0
DEFAULT_LEASE_SECONDS = 60.0
"""How long a claimed, unacknowledged message stays invisible to a live consumer."""

_local_wakeups: dict[tuple[str, str], threading.Event] = {}
_local_wakeups_lock = threading.Lock()


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def notify_channel(queue: str) -> str:
    """The PostgreSQL NOTIFY channel of a queue (a short, safe identifier)."""
    return "ffq_" + hashlib.sha256(queue.encode()).hexdigest()[:24]


def _wakeup_for(url: str, queue: str) -> threading.Event:
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
            _wakeup_for(self.url, target).set()

    def insert_raw(self, queue: str, raw: bytes) -> None:
        """Store raw bytes in ``queue`` as if a broken sender had sent them (tests, tools)."""
        with self.engine.begin() as connection:
            connection.execute(
                insert(queue_messages).values(
                    queue=queue, message_id=None, frame=raw, enqueued_at=_ms(time.time())
                )
            )
        _wakeup_for(self.url, queue).set()

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
    ) -> Claim:
        """Lease visible messages of ``queue``, oldest first, by count and by bytes.

        At most ``limit`` of them and ``max_bytes`` of frames, but at least one if one is
        within ``max_frame_bytes``. Frames are only loaded for the rows leased. A candidate
        over ``max_frame_bytes`` is dead-lettered instead, in the same transaction, without
        its frame leaving the database (see the module docstring).
        """
        now = _ms(time.time())
        candidates = (
            select(queue_messages.c.id, func.length(queue_messages.c.frame))
            .where(
                queue_messages.c.queue == queue,
                or_(queue_messages.c.lease_until.is_(None), queue_messages.c.lease_until < now),
            )
            .order_by(queue_messages.c.id)
            .limit(limit)
        )
        if self.dialect == "postgresql":
            candidates = candidates.with_for_update(skip_locked=True)
        with self._write_engine().begin() as connection:
            chosen, oversized = _take_prefix(
                [(int(row_id), int(size)) for row_id, size in connection.execute(candidates)],
                max_bytes,
                max_frame_bytes,
            )
            for row_id, size in oversized:
                self._dead_letter_oversized(connection, row_id, size, max_frame_bytes, now)
            rows: list[tuple[int, bytes]] = []
            if chosen:
                statement = (
                    update(queue_messages)
                    .where(queue_messages.c.id.in_(chosen))
                    .values(
                        lease_owner=owner,
                        lease_until=now + _ms(lease_seconds),
                        deliveries=queue_messages.c.deliveries + 1,
                    )
                    .returning(queue_messages.c.id, queue_messages.c.frame)
                )
                rows = [(int(r[0]), bytes(r[1])) for r in connection.execute(statement)]
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

    def acknowledge(self, queue: str, row_ids: Sequence[int]) -> None:
        """Delete acknowledged deliveries (by row: other copies of the same id stay)."""
        with self.engine.begin() as connection:
            for start in range(0, len(row_ids), 500):
                chunk = list(row_ids[start : start + 500])
                connection.execute(
                    delete(queue_messages).where(
                        queue_messages.c.queue == queue, queue_messages.c.id.in_(chunk)
                    )
                )

    def dead_letter(
        self, queue: str, row_id: int, raw: bytes, reason: str, message_id: str | None = None
    ) -> None:
        """Move one stored message to the dead letters, with the reason (one transaction).

        The message id (when known) and the reason are stored as bounded copies
        (:mod:`persistence.bounded`), so this never fails because of what the message holds.
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


class SqlQueueMessaging:
    """A node's ``MessagingService`` on the SQL queue at ``url`` (see the module docstring).

    ``window`` and ``window_bytes`` bound what the node holds delivered and unacknowledged (in
    messages, and in frame bytes plus at most one frame); ``max_frame_bytes`` is the largest
    frame it takes (larger ones are dead-lettered).
    """

    def __init__(
        self,
        url: str,
        address: str,
        *,
        synchronous: str = "FULL",
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        consumer_id: str | None = None,
        window: int = DEFAULT_WINDOW,
        window_bytes: int = DEFAULT_WINDOW_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if window < 1 or window_bytes < 1 or max_frame_bytes < 1:
            raise ValueError("window, window_bytes and max_frame_bytes must be positive")
        self._address = address
        self._lease_seconds = lease_seconds
        self._window = window
        self._window_bytes = window_bytes
        self._max_frame_bytes = max_frame_bytes
        self.broker = SqlQueueBroker(
            url,
            synchronous=synchronous,
            application_name=None if consumer_id is None else application_name(consumer_id),
        )
        self._handlers: dict[str, MessageHandler] = {}
        self._owner = consumer_id or uuid.uuid4().hex
        self._pending_acks: list[int] = []  # row ids of settled deliveries
        self._outstanding: dict[int, int] = {}  # row id -> frame size, delivered, not settled
        self._outstanding_bytes = 0
        self._acks_lock = threading.Lock()
        """Guards the pending acks and the outstanding deliveries."""
        self._wakeup = _wakeup_for(self.broker.url, address)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.window_full = threading.Event()
        """Set while the consumer waits, its window full, for acknowledgements (tests)."""
        self.delivered = 0
        """Messages handed to handlers (redeliveries included)."""
        self.dead_lettered = 0
        """Frames this consumer moved to the dead letters."""
        self.broker.create_queue(address)

    @property
    def my_address(self) -> str:
        """The queue name of this node."""
        return self._address

    @property
    def consumer_id(self) -> str:
        """The id this consumer leases messages under (a node passes its worker id)."""
        return self._owner

    def release_deliveries_of(self, consumer_ids: Sequence[str]) -> None:
        """Deliver again now what consumers known to be dead had leased.

        (Without this their leases would have to expire first.)
        """
        released = self.broker.release_leases(self._address, list(consumer_ids))
        if released:
            log.info(
                "%s: %d messages leased by a dead consumer will be delivered again",
                self._address,
                released,
            )

    def add_handler(self, topic: str, callback: MessageHandler) -> None:
        """Deliver ``topic`` messages to ``callback`` (on the consumer thread)."""
        if topic in self._handlers:
            raise ValueError(f"a handler for topic {topic!r} is already registered")
        self._handlers[topic] = callback

    def start(self) -> None:
        """Start consuming.

        Messages another consumer leased come once their leases expire, or at once after
        :meth:`release_deliveries_of`.
        """
        if self._thread is not None:
            raise RuntimeError(f"the consumer of {self._address} is already running")
        self._forget_outstanding()
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._consume, name=f"sqlqueue-consumer-{self._address}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop consuming, write buffered acknowledgements, close connections.

        What was delivered but not acknowledged is given back (the next consumer gets it at
        once).
        """
        self._halt()
        try:
            self._flush_acks()
            with contextlib.suppress(SQLAlchemyError):  # else the leases simply expire
                self.broker.release_leases(self._address, [self._owner])
        finally:
            self._forget_outstanding()
            self.broker.close()

    def abandon(self) -> None:
        """Stop as a crashed process would: buffered acknowledgements are lost (tests)."""
        self._halt()
        with self._acks_lock:
            self._pending_acks = []
        self._forget_outstanding()
        self.broker.close()

    def _forget_outstanding(self) -> None:
        with self._acks_lock:
            self._outstanding = {}
            self._outstanding_bytes = 0

    def _halt(self) -> None:
        self._stopping.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            if self._thread.is_alive():
                log.error("%s: the consumer thread did not stop within 30 s", self._address)
            self._thread = None

    def send(self, message: Message, target: str) -> None:
        """Commit ``message`` to ``target``'s queue."""
        self.broker.enqueue([(message, target)])

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """Commit every pair in one transaction."""
        self.broker.enqueue(items)

    def acknowledge(self, delivered: Message) -> None:
        """Mark this delivery done; its row is deleted by the consumer thread shortly."""
        if not isinstance(delivered.receipt, int):
            raise ValueError(f"{delivered.message_id} was not delivered by this queue")
        with self._acks_lock:
            self._pending_acks.append(delivered.receipt)
            self._outstanding_bytes -= self._outstanding.pop(delivered.receipt, 0)
        self._wakeup.set()

    @property
    def outstanding(self) -> tuple[int, int]:
        """(deliveries, frame bytes) handed to the handlers and not yet acknowledged."""
        with self._acks_lock:
            return len(self._outstanding), self._outstanding_bytes

    def _flush_acks(self) -> None:
        with self._acks_lock:
            acks, self._pending_acks = self._pending_acks, []
        if acks:
            try:
                self.broker.acknowledge(self._address, acks)
            except SQLAlchemyError:
                with self._acks_lock:
                    self._pending_acks[:0] = acks
                raise

    def _room(self) -> tuple[int, int]:
        """How many more deliveries, and frame bytes, the window allows now."""
        count, size = self.outstanding
        return self._window - count, self._window_bytes - size

    def _consume(self) -> None:
        listener = None
        interval = MIN_POLL_SECONDS
        failures = 0
        while not self._stopping.is_set():
            try:
                if listener is None and self.broker.dialect == "postgresql":
                    listener = self.broker.listen_connection(self._address)
                self._flush_acks()
                room, room_bytes = self._room()
                if room <= 0 or room_bytes <= 0:
                    self._wait_for_room(listener)
                    continue
                self.window_full.clear()
                claim = self.broker.claim(
                    self._address,
                    self._owner,
                    min(CLAIM_BATCH, room),
                    self._lease_seconds,
                    max_bytes=min(CLAIM_BYTES, room_bytes),
                    max_frame_bytes=self._max_frame_bytes,
                )
                failures = 0
            except Exception as error:  # database unavailable: back off and try again
                failures += 1
                delay = min(0.05 * 2**failures, 5.0)
                log.warning(
                    "%s: queue database error (%s); retry in %.2f s", self._address, error, delay
                )
                if listener is not None:
                    listener.close()
                    listener = None
                self._stopping.wait(delay)
                continue
            self.dead_lettered += claim.dead_lettered
            for row_id, raw in claim.rows:
                if self._stopping.is_set():
                    break  # leased but not delivered: the next consumer takes them over
                self._deliver(row_id, raw)
            if claim.rows or claim.dead_lettered:
                interval = MIN_POLL_SECONDS
                continue
            self._wait(listener, interval)
            interval = min(interval * 2, MAX_POLL_SECONDS)
        self.window_full.clear()
        if listener is not None:
            listener.close()

    def _wait_for_room(self, listener: Any) -> None:
        """The window is full: wait for an acknowledgement (or a stop), claiming nothing."""
        self.window_full.set()
        self._wakeup.wait(MAX_POLL_SECONDS)
        self._wakeup.clear()
        if listener is not None:  # drop the notifications meanwhile: they must not pile up
            for _ in listener.notifies(timeout=0):
                pass

    def _wait(self, listener: Any, interval: float) -> None:
        if listener is None:
            self._wakeup.wait(interval)
            self._wakeup.clear()
            return
        if self._wakeup.is_set():
            self._wakeup.clear()
            return
        # PostgreSQL: sleep until NOTIFY (or the safety-net poll), checking local wakeups often.
        deadline = time.monotonic() + LISTEN_POLL_SECONDS
        while not self._stopping.is_set() and time.monotonic() < deadline:
            if any(True for _ in listener.notifies(timeout=0.02, stop_after=1)):
                return
            if self._wakeup.is_set():
                self._wakeup.clear()
                return

    def _deliver(self, row_id: int, raw: bytes) -> None:
        try:
            message = attrs.evolve(decode_frame(raw, self._max_frame_bytes), receipt=row_id)
        except MalformedFrameError as error:
            self._dead_letter(row_id, raw, str(error), None)
            return
        handler = self._handlers.get(message.topic)
        if handler is None:
            reason = f"no handler for topic {message.topic!r} at {self._address}"
            self._dead_letter(row_id, raw, reason, message.message_id)
            return
        with self._acks_lock:
            if row_id not in self._outstanding:  # (a redelivery after its lease expired)
                self._outstanding[row_id] = len(raw)
                self._outstanding_bytes += len(raw)
        self.delivered += 1
        try:
            handler(message)
        except Exception:  # a handler bug must not kill the consumer; the lease will expire
            log.exception("%s: handler failed on %s", self._address, message.message_id)

    def _dead_letter(self, row_id: int, raw: bytes, reason: str, message_id: str | None) -> None:
        log.warning("%s: dead-lettering stored message %d: %s", self._address, row_id, reason)
        self.broker.dead_letter(self._address, row_id, raw, reason, message_id)
        self.dead_lettered += 1
