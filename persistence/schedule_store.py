"""The ``node_schedules`` table: flows started on a schedule (see :mod:`flows.node.schedules`).

Clients and operators add, pause, resume and remove schedules (each a transaction of its
own); the node fires due slots. Firing a slot is one transaction: the schedule moves on to
its next slot only if it still waits for the slot being fired (compare and set), and the
slot's flow request is inserted with an id derived from the schedule and the slot (an
existing one is kept). So however often a slot is fired (after a crash, by a second look),
it starts one flow.
"""

from __future__ import annotations

from typing import Any

import attrs
from sqlalchemy import delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from persistence import schema
from persistence.fencing import FencedEngine
from persistence.node_store import FlowRequest
from persistence.schema import millis
from statemachine.partitions import partition_of


@attrs.frozen
class ScheduleRow:
    """One schedule as stored (times in seconds since the epoch)."""

    schedule_id: str
    flow_class: str
    arguments: bytes
    kind: str
    """``once``, ``every`` or ``cron``."""
    spec: str
    """The time (once), the seconds between slots (every) or the cron expression."""
    missed: str
    """What a node that was down does with missed slots: ``skip`` or ``catch-up``."""
    next_slot: float | None
    """The next slot not yet fired; None once a one-off schedule has fired."""
    paused: bool
    fired: int
    """How many slots started a flow."""
    last_slot: float | None
    """The last slot that started a flow."""
    created_at: float


class ScheduleExistsError(ValueError):
    """A schedule with that id already exists."""


class SqlSchedules:
    """The node's schedules on SQL (SQLite or PostgreSQL)."""

    def __init__(self, fence: FencedEngine) -> None:
        """The schedules of the node database behind ``fence``."""
        self._fence = fence

    def add(self, row: ScheduleRow) -> None:
        """Store a new schedule; :class:`ScheduleExistsError` if its id is taken."""
        values = attrs.asdict(row)
        for name in ("next_slot", "last_slot", "created_at"):
            if values[name] is not None:
                values[name] = millis(values[name])
        try:
            with self._fence.engine.begin() as connection:
                connection.execute(insert(schema.node_schedules).values(**values))
        except IntegrityError:
            raise ScheduleExistsError(
                f"a schedule named {row.schedule_id!r} exists already (remove it first)"
            ) from None

    def all(self) -> list[ScheduleRow]:
        """Every schedule, by id."""
        table = schema.node_schedules
        with self._fence.reader.connect() as connection:
            rows = connection.execute(select(table).order_by(table.c.schedule_id)).all()
        return [_row(row._mapping) for row in rows]

    def due(self, now: float) -> list[ScheduleRow]:
        """Schedules not paused whose next slot is at or before ``now``."""
        table = schema.node_schedules
        query = (
            select(table)
            .where(table.c.paused.is_(False), table.c.next_slot <= millis(now))
            .order_by(table.c.next_slot, table.c.schedule_id)
        )
        with self._fence.reader.connect() as connection:
            return [_row(row._mapping) for row in connection.execute(query)]

    def set_paused(self, schedule_id: str, paused: bool) -> None:
        """Pause or resume a schedule; KeyError if there is none of that id."""
        self._change(schedule_id, update(schema.node_schedules).values(paused=paused))

    def remove(self, schedule_id: str) -> None:
        """Remove a schedule (flows it started are not touched); KeyError if none."""
        self._change(schedule_id, delete(schema.node_schedules))

    def fire(
        self,
        schedule: ScheduleRow,
        request: FlowRequest | None,
        slot: float | None,
        next_slot: float | None,
        at: float,
    ) -> bool:
        """Move ``schedule`` past its due slots and, with ``request``, start ``slot``'s flow.

        One transaction, fenced by the node's lease; nothing happens (False) if the schedule
        no longer waits for the slot it was read with (fired meanwhile, or removed).
        """
        assert schedule.next_slot is not None
        table = schema.node_schedules
        changes: dict[str, Any] = {"next_slot": None if next_slot is None else millis(next_slot)}
        if request is not None:
            assert slot is not None
            changes.update(fired=table.c.fired + 1, last_slot=millis(slot))
        with self._fence.fenced() as connection:
            moved = connection.execute(
                update(table)
                .where(
                    table.c.schedule_id == schedule.schedule_id,
                    table.c.next_slot == millis(schedule.next_slot),
                )
                .values(**changes)
            )
            if moved.rowcount != 1:
                return False
            if request is not None:
                module: Any = {"sqlite": sqlite, "postgresql": postgresql}[connection.dialect.name]
                connection.execute(
                    module.insert(schema.node_flow_requests)
                    .values(
                        request_id=request.request_id,
                        flow_class=request.flow_class,
                        arguments=request.arguments,
                        requested_at=millis(at),
                        started_at=None,
                        partition=partition_of(request.request_id),
                    )
                    .on_conflict_do_nothing(index_elements=["request_id"])
                )
        return True

    def _change(self, schedule_id: str, statement: Any) -> None:
        table = schema.node_schedules
        with self._fence.engine.begin() as connection:
            changed = connection.execute(statement.where(table.c.schedule_id == schedule_id))
        if changed.rowcount != 1:
            raise KeyError(f"no schedule named {schedule_id!r}")


def _row(mapping: Any) -> ScheduleRow:
    def seconds(value: int | None) -> float | None:
        return None if value is None else value / 1000

    return ScheduleRow(
        schedule_id=mapping["schedule_id"],
        flow_class=mapping["flow_class"],
        arguments=bytes(mapping["arguments"]),
        kind=mapping["kind"],
        spec=mapping["spec"],
        missed=mapping["missed"],
        next_slot=seconds(mapping["next_slot"]),
        paused=bool(mapping["paused"]),
        fired=int(mapping["fired"]),
        last_slot=seconds(mapping["last_slot"]),
        created_at=mapping["created_at"] / 1000,
    )
