"""The outbox on the node database: what the outbox relays send, and delete once sent.

Rows are written by the state machine's transactions (:mod:`persistence.sql_transaction`),
in the transaction that decided to send them; a relay (:mod:`messaging.outbox_relay`,
:mod:`messaging.background_relay`) reads them here and deletes each row once the transport
has durably taken it (the relays' ``OutboxStore``).

Deleting can wait for a transaction the node commits anyway: :meth:`SqlOutbox.delete_later`
queues the ids in :class:`WaitingDeletes`, and the next state machine transaction deletes
them before it commits (all or nothing with it: if it rolls back, they wait for the next).
What no transaction has taken within a while, :meth:`SqlOutbox.delete_waiting` deletes in a
transaction of its own (a node with nothing else to commit). Until the delete commits, a
restart sends the rows again, which the receiver drops by id: a delete may wait, never lose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from sqlalchemy import Connection, bindparam, delete, func, select

from foundation.engine import chunks
from persistence import schema
from persistence.fencing import FencedEngine
from persistence.sqlite_writes import SqliteWrites
from statemachine.ports import OutboxRow


class WaitingDeletes:
    """Ids of outbox rows the transport has taken, waiting to be deleted (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: list[str] = []
        self._since: float | None = None

    def add(self, message_ids: Sequence[str]) -> None:
        """Queue ids (a relay's thread)."""
        if not message_ids:
            return
        with self._lock:
            if not self._ids:
                self._since = time.monotonic()
            self._ids.extend(message_ids)

    def take(self, older_than: float = 0.0) -> list[str]:
        """Every queued id, if the oldest has waited ``older_than`` seconds; else none."""
        with self._lock:
            if not self._ids or self._since is None:
                return []
            if time.monotonic() - self._since < older_than:
                return []
            taken, self._ids, self._since = self._ids, [], None
            return taken

    def give_back(self, message_ids: Sequence[str]) -> None:
        """Queue again ids whose delete did not commit."""
        if not message_ids:
            return
        with self._lock:
            self._ids[:0] = message_ids
            self._since = time.monotonic() if self._since is None else self._since

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)


_DELETE_IN = delete(schema.node_outbox).where(
    schema.node_outbox.c.message_id.in_(bindparam("ids", expanding=True))
)


def delete_rows(connection: Connection, message_ids: Sequence[str]) -> None:
    """Delete these outbox rows in ``connection``'s transaction.

    On SQLite, one ``executemany`` of a delete by key on the sqlite3 cursor; elsewhere one
    ``IN`` statement per chunk of ids.
    """
    if connection.dialect.name == "sqlite":
        SqliteWrites(connection).delete_many(schema.node_outbox, "message_id", message_ids)
        return
    for chunk in chunks(message_ids):
        connection.execute(_DELETE_IN, {"ids": chunk})


class SqlOutbox:
    """The ``node_outbox`` table, as the outbox relays use it."""

    def __init__(self, fence: FencedEngine) -> None:
        """The outbox of the node database behind ``fence``."""
        self._fence = fence
        self.waiting = WaitingDeletes()
        """Rows to delete with the next state machine transaction (it takes them)."""

    def pending_outbox(self) -> list[OutboxRow]:
        """Every outbox row, oldest first (what a starting relay must send)."""
        table = schema.node_outbox
        query = select(table.c.message_id, table.c.target, table.c.payload).order_by(
            table.c.created_at, table.c.message_id
        )
        with self._fence.reader.connect() as connection:
            return [OutboxRow(*row) for row in connection.execute(query)]

    def contains(self, message_id: str) -> bool:
        """True if the row ``message_id`` is still in the outbox."""
        table = schema.node_outbox
        query = select(table.c.message_id).where(table.c.message_id == message_id)
        with self._fence.reader.connect() as connection:
            return connection.execute(query).first() is not None

    def depth(self) -> tuple[int, float | None]:
        """How many rows the outbox holds, and when the oldest was written (None if empty).

        One query; rows the transport took and the next transaction will delete count too.
        """
        table = schema.node_outbox
        query = select(func.count(), func.min(table.c.created_at))
        with self._fence.reader.connect() as connection:
            count, oldest = connection.execute(query.select_from(table)).one()
        return int(count), None if oldest is None else oldest / 1000

    def delete_outbox(self, message_ids: Sequence[str]) -> None:
        """Delete outbox rows the transport has durably taken (a transaction of their own)."""
        if not message_ids:
            return
        with self._fence.engine.begin() as connection:
            delete_rows(connection, message_ids)

    def delete_later(self, message_ids: Sequence[str]) -> None:
        """Delete these rows with the node's next transaction (see the module docstring)."""
        self.waiting.add(message_ids)

    def delete_waiting(self, older_than: float = 0.0) -> int:
        """Delete the queued rows no transaction took, if the oldest waited ``older_than`` s.

        In a transaction of their own; returns how many ids it deleted.
        """
        message_ids = self.waiting.take(older_than)
        try:
            self.delete_outbox(message_ids)
        except BaseException:
            self.waiting.give_back(message_ids)
            raise
        return len(message_ids)
