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
  with ``SELECT ... FOR UPDATE SKIP LOCKED``, on SQLite under the database write lock.
  Acknowledging a delivery deletes its row (its ``receipt`` is the row id), no other. A
  consumer's leases expire after ``lease_seconds`` (then the messages are delivered again);
  a consumer that stops cleanly gives its leases back, and a node that took over from a dead
  process releases that process's leases at once (:meth:`SqlQueueMessaging.release_deliveries_of`).
  A starting consumer never takes the leases of a live one.
* ``ff_queue_dead_letters``: frames that could not be decoded, with the reason.

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
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import attrs
from sqlalchemy import (
    BigInteger,
    Column,
    Engine,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    func,
    insert,
    inspect,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from messaging.frame import MalformedFrameError, decode_frame, encode_frame
from messaging.service import Message, MessageHandler, TransportError
from persistence.lease import application_name
from persistence.store import configure_sqlite, create_tables, normalize_url

log = logging.getLogger("fiberflow.sqlqueue")

metadata = MetaData()
_ROW_ID = BigInteger().with_variant(Integer, "sqlite")  # INTEGER PRIMARY KEY is SQLite's rowid

queues = Table(
    "ff_queues",
    metadata,
    Column("name", String(512), primary_key=True),
    Column("created_at", BigInteger, nullable=False),
)

queue_messages = Table(
    "ff_queue_messages",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("queue", String(512), nullable=False),
    Column("message_id", String(512), nullable=True),
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
    Column("queue", String(512), nullable=False),
    Column("message_id", String(512), nullable=True),
    Column("frame", LargeBinary, nullable=False),
    Column("reason", Text, nullable=False),
    Column("dead_lettered_at", BigInteger, nullable=False),
)

CLAIM_BATCH = 200
"""Messages claimed per query."""
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
        connect_args: dict[str, Any] = {}
        if application_name is not None and self.url.startswith("postgresql"):
            connect_args["application_name"] = application_name
        engine = create_engine(self.url, connect_args=connect_args)
        self.dialect = engine.dialect.name
        if self.dialect == "sqlite":
            configure_sqlite(engine, synchronous)
        elif self.dialect != "postgresql":
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
        self, queue: str, owner: str, limit: int, lease_seconds: float
    ) -> list[tuple[int, bytes]]:
        """Lease up to ``limit`` visible messages of ``queue``; (row id, frame), oldest first."""
        now = _ms(time.time())
        candidates = (
            select(queue_messages.c.id)
            .where(
                queue_messages.c.queue == queue,
                or_(queue_messages.c.lease_until.is_(None), queue_messages.c.lease_until < now),
            )
            .order_by(queue_messages.c.id)
            .limit(limit)
        )
        if self.dialect == "postgresql":
            candidates = candidates.with_for_update(skip_locked=True)
        statement = (
            update(queue_messages)
            .where(queue_messages.c.id.in_(candidates.scalar_subquery()))
            .values(
                lease_owner=owner,
                lease_until=now + _ms(lease_seconds),
                deliveries=queue_messages.c.deliveries + 1,
            )
            .returning(queue_messages.c.id, queue_messages.c.frame)
        )
        with self.engine.begin() as connection:
            rows = [(int(r[0]), bytes(r[1])) for r in connection.execute(statement)]
        rows.sort()
        return rows

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

    def dead_letter(self, queue: str, row_id: int, raw: bytes, reason: str) -> None:
        """Move one stored message to the dead letters, with the reason (one transaction)."""
        with self.engine.begin() as connection:
            connection.execute(
                insert(queue_dead_letters).values(
                    queue=queue,
                    message_id=None,
                    frame=raw,
                    reason=reason,
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
    """A node's ``MessagingService`` on the SQL queue at ``url`` (see the module docstring)."""

    def __init__(
        self,
        url: str,
        address: str,
        *,
        synchronous: str = "FULL",
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        consumer_id: str | None = None,
    ) -> None:
        self._address = address
        self._lease_seconds = lease_seconds
        self.broker = SqlQueueBroker(
            url,
            synchronous=synchronous,
            application_name=None if consumer_id is None else application_name(consumer_id),
        )
        self._handlers: dict[str, MessageHandler] = {}
        self._owner = consumer_id or uuid.uuid4().hex
        self._pending_acks: list[int] = []  # row ids of settled deliveries
        self._acks_lock = threading.Lock()
        self._wakeup = _wakeup_for(self.broker.url, address)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
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
            self.broker.close()

    def abandon(self) -> None:
        """Stop as a crashed process would: buffered acknowledgements are lost (tests)."""
        self._halt()
        with self._acks_lock:
            self._pending_acks = []
        self.broker.close()

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
        self._wakeup.set()

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

    def _consume(self) -> None:
        listener = None
        interval = MIN_POLL_SECONDS
        failures = 0
        while not self._stopping.is_set():
            try:
                if listener is None and self.broker.dialect == "postgresql":
                    listener = self.broker.listen_connection(self._address)
                self._flush_acks()
                rows = self.broker.claim(
                    self._address, self._owner, CLAIM_BATCH, self._lease_seconds
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
            for row_id, raw in rows:
                if self._stopping.is_set():
                    break  # leased but not delivered: the next consumer takes them over
                self._deliver(row_id, raw)
            if rows:
                interval = MIN_POLL_SECONDS
                continue
            self._wait(listener, interval)
            interval = min(interval * 2, MAX_POLL_SECONDS)
        if listener is not None:
            listener.close()

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
            message = attrs.evolve(decode_frame(raw), receipt=row_id)
        except MalformedFrameError as error:
            log.warning("%s: dead-lettering stored message %d: %s", self._address, row_id, error)
            self.broker.dead_letter(self._address, row_id, raw, str(error))
            self.dead_lettered += 1
            return
        handler = self._handlers.get(message.topic)
        if handler is None:
            log.warning(
                "%s: no handler for topic %r; dropping %s",
                self._address,
                message.topic,
                message.message_id,
            )
            self.acknowledge(message)
            return
        self.delivered += 1
        try:
            handler(message)
        except Exception:  # a handler bug must not kill the consumer; the lease will expire
            log.exception("%s: handler failed on %s", self._address, message.message_id)
