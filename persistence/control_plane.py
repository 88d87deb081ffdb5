"""The operator control plane on the node database (the :class:`ControlPlane` contract).

Clients queue flow requests (``node_flow_requests``; the node claims them in the transaction
that checkpoints their flows, see :mod:`persistence.sql_transaction`), operators queue
commands (``node_operator_requests``), and the node remembers paused flows
(``node_paused_flows``) and settings (``node_settings``) across restarts. The node process's
watchdog notes flows whose code runs long (``node_running_flows``).

What the node writes for its flows is fenced by its lease; the requests of clients and
operators, and the watchdog's notes, are written by other processes (or threads) and are not.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import delete, exists, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from foundation.engine import chunks, upsert
from persistence import schema
from persistence.fencing import FencedEngine
from persistence.node_store import ControlPlane, FlowRequest, OperatorRequest, PendingFlowRequest
from persistence.schema import millis
from statemachine.partitions import partition_of


class SqlControlPlane(ControlPlane):
    """The :class:`~persistence.node_store.ControlPlane` on SQL tables."""

    def __init__(self, fence: FencedEngine) -> None:
        """The control plane of the node database behind ``fence``."""
        self._fence = fence

    def request_flows(self, requests: Sequence[FlowRequest], at: float) -> None:
        """Ask the node to start flows (one transaction; an existing request id is kept)."""
        table = schema.node_flow_requests
        rows = [
            {
                "request_id": r.request_id,
                "flow_class": r.flow_class,
                "arguments": r.arguments,
                "requested_at": millis(at),
                "started_at": None,
                "partition": partition_of(r.request_id),
            }
            for r in requests
        ]
        if not rows:
            return
        engine = self._fence.engine
        module: Any = {"sqlite": sqlite, "postgresql": postgresql}[engine.dialect.name]
        with engine.begin() as connection:
            for chunk in chunks(rows):
                connection.execute(
                    module.insert(table).on_conflict_do_nothing(index_elements=["request_id"]),
                    chunk,
                )

    def pending_flow_requests(self, limit: int) -> list[FlowRequest]:
        """Requested flows not started yet, oldest first."""
        table = schema.node_flow_requests
        query = (
            select(table.c.request_id, table.c.flow_class, table.c.arguments)
            .where(table.c.started_at.is_(None))
            .order_by(table.c.requested_at, table.c.request_id)
            .limit(limit)
        )
        with self._fence.reader.connect() as connection:
            return [FlowRequest(*row) for row in connection.execute(query)]

    def flow_requests_to_start(
        self, limit: int, partitions: Collection[int] | None = None
    ) -> list[PendingFlowRequest]:
        """Requested flows not started yet, oldest first, each with whether its id is a flow's.

        One statement: the pending requests, and for each whether a checkpoint or an outcome
        already carries its id. With ``partitions``, only requests for flows of those.
        """
        table = schema.node_flow_requests
        flow_tables = (
            schema.node_checkpoints,
            schema.node_flow_results,
            schema.node_flow_exceptions,
        )
        already = or_(*(exists().where(t.c.flow_id == table.c.request_id) for t in flow_tables))
        query = (
            select(table.c.request_id, table.c.flow_class, table.c.arguments, already)
            .where(table.c.started_at.is_(None))
            .order_by(table.c.requested_at, table.c.request_id)
            .limit(limit)
        )
        if partitions is not None:
            query = query.where(table.c.partition.in_(sorted(partitions)))
        with self._fence.reader.connect() as connection:
            return [
                PendingFlowRequest(FlowRequest(request_id, flow_class, arguments), bool(known))
                for request_id, flow_class, arguments, known in connection.execute(query)
            ]

    def request_operation(self, action: str, flow_id: str | None, at: float) -> str:
        """Queue an operator command for the node; returns its request id."""
        request_id = uuid.uuid4().hex
        with self._fence.engine.begin() as connection:
            connection.execute(
                insert(schema.node_operator_requests).values(
                    request_id=request_id,
                    action=action,
                    flow_id=flow_id,
                    requested_at=millis(at),
                )
            )
        return request_id

    def pending_operations(self) -> list[OperatorRequest]:
        """Operator commands not yet carried out, oldest first."""
        table = schema.node_operator_requests
        query = (
            select(table.c.request_id, table.c.action, table.c.flow_id)
            .where(table.c.done_at.is_(None))
            .order_by(table.c.requested_at, table.c.request_id)
        )
        with self._fence.reader.connect() as connection:
            return [OperatorRequest(*row) for row in connection.execute(query)]

    def finish_operation(self, request_id: str, outcome: str, at: float) -> None:
        """Record what an operator command did."""
        table = schema.node_operator_requests
        with self._fence.fenced() as connection:
            connection.execute(
                update(table)
                .where(table.c.request_id == request_id)
                .values(done_at=millis(at), outcome=outcome)
            )

    def operation_outcome(self, request_id: str) -> str | None:
        """What an operator command did, or None while the node has not done it."""
        table = schema.node_operator_requests
        with self._fence.reader.connect() as connection:
            row = connection.execute(
                select(table.c.outcome).where(table.c.request_id == request_id)
            ).first()
        return None if row is None else row.outcome

    def set_paused(self, flow_id: str, paused: bool, at: float) -> None:
        """Remember (or forget) that ``flow_id`` is paused, across restarts."""
        table = schema.node_paused_flows
        with self._fence.fenced() as connection:
            connection.execute(delete(table).where(table.c.flow_id == flow_id))
            if paused:
                connection.execute(insert(table).values(flow_id=flow_id, paused_at=millis(at)))

    def paused_flows(self) -> set[str]:
        """The flows operators paused."""
        table = schema.node_paused_flows
        with self._fence.reader.connect() as connection:
            return set(connection.execute(select(table.c.flow_id)).scalars())

    def set_setting(self, name: str, value: str | None, at: float) -> None:
        """Store (or with None, remove) a node-wide setting, across restarts."""
        table = schema.node_settings
        with self._fence.fenced() as connection:
            connection.execute(delete(table).where(table.c.name == name))
            if value is not None:
                connection.execute(
                    insert(table).values(name=name, value=value, updated_at=millis(at))
                )

    def setting(self, name: str) -> str | None:
        """A node-wide setting, or None if it is not set."""
        table = schema.node_settings
        with self._fence.reader.connect() as connection:
            found = connection.execute(select(table.c.value).where(table.c.name == name))
            return found.scalar_one_or_none()

    def note_busy_flow(self, flow_id: str, since: float, location: str) -> None:
        """Record that ``flow_id``'s code has been running since ``since`` (at ``location``).

        Written by the node process's watchdog thread, outside the lease's fencing: it is a
        note for operators, never a fact flows depend on.
        """
        table = schema.node_running_flows
        row = {
            "flow_id": flow_id,
            "since": millis(since),
            "location": location[:2000],
            "noted_at": millis(time.time()),
        }
        with self._fence.writer.begin() as connection:
            upsert(connection, table, [row], "flow_id")

    def clear_busy_flow(self, flow_id: str) -> None:
        """Forget the note of :meth:`note_busy_flow` (the flow suspended or stopped)."""
        table = schema.node_running_flows
        with self._fence.writer.begin() as connection:
            connection.execute(delete(table).where(table.c.flow_id == flow_id))

    def busy_flows(self) -> dict[str, tuple[int, str]]:
        """Flow id -> (running since, in ms; location) of the flows noted as running long."""
        table = schema.node_running_flows
        with self._fence.reader.connect() as connection:
            rows = connection.execute(select(table.c.flow_id, table.c.since, table.c.location))
            return {row.flow_id: (row.since, row.location) for row in rows}
