"""The outbox on the node database: what the outbox relays send, and delete once sent.

Rows are written by the state machine's transactions (:mod:`persistence.sql_transaction`),
in the transaction that decided to send them; a relay (:mod:`messaging.outbox_relay`,
:mod:`messaging.background_relay`) reads them here and deletes each row once the transport
has durably taken it (the relays' ``OutboxStore``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select

from persistence import schema
from persistence.fencing import FencedEngine
from statemachine.ports import OutboxRow


class SqlOutbox:
    """The ``node_outbox`` table, as the outbox relays use it."""

    def __init__(self, fence: FencedEngine) -> None:
        """The outbox of the node database behind ``fence``."""
        self._fence = fence

    def pending_outbox(self) -> list[OutboxRow]:
        """Every outbox row, oldest first (what a starting relay must send)."""
        table = schema.node_outbox
        query = select(table.c.message_id, table.c.target, table.c.payload).order_by(
            table.c.created_at, table.c.message_id
        )
        with self._fence.reader.connect() as connection:
            return [OutboxRow(*row) for row in connection.execute(query)]

    def delete_outbox(self, message_ids: Sequence[str]) -> None:
        """Delete outbox rows the transport has durably taken."""
        if not message_ids:
            return
        table = schema.node_outbox
        with self._fence.engine.begin() as connection:
            connection.execute(delete(table).where(table.c.message_id.in_(list(message_ids))))
