"""Scheduled flows: a ``@startable_by_rpc`` flow started once at a time, or repeatedly.

A schedule (a row of ``node_schedules``, :mod:`persistence.schedule_store`) names a flow, its
arguments and when to start it: ``once`` at a time, ``every`` so many seconds, or by a
``cron`` expression (five fields, UTC; parsed by the croniter library). Each time at which a
flow is due is a *slot*. The node looks for due slots whenever it polls for flow requests;
firing a slot writes, in one transaction, the schedule's next slot and a flow request whose
id is derived from the schedule and the slot (:func:`slot_request_id`). The request is then
started like any client's request: exactly once. A crash between the two parts is
impossible (one transaction), and firing the same slot twice makes the same request id.

When several slots of a schedule are due at once (the node was down, or the schedule was
paused), the earlier ones are missed and at most one flow starts, for the latest: with the
``skip`` policy only if that slot is at most :data:`GRACE_SECONDS` late, with ``catch-up``
however late. Either way the schedule goes on from its first slot after now.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import re
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import attrs
from croniter import croniter

from flows.decorators import flow_class_name_problem
from flows.flow_logic import FlowLogic
from flows.markings import is_startable_by_rpc
from flows.node.flow_requests import encode_arguments
from foundation.serialization import PAYLOADS, Serializer, qualified_name
from persistence.node_store import FlowRequest
from persistence.schedule_store import ScheduleRow, SqlSchedules
from statemachine.limits import SCHEDULE_ID_CHARS, SCHEDULE_SPEC_CHARS
from statemachine.partitions import partition_of

KINDS = ("once", "every", "cron")
"""How a schedule repeats."""
MISSED_POLICIES = ("skip", "catch-up")
"""What a schedule does with the slots a node missed."""
GRACE_SECONDS = 60.0
"""A slot fired at most this late counts as on time; later, it was missed."""
_SCHEDULE_ID = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._:-]{{0,{SCHEDULE_ID_CHARS - 1}}}$")


class ScheduleError(ValueError):
    """A schedule that cannot be made: the message says what is wrong."""


def slot_request_id(schedule_id: str, slot: float) -> str:
    """The id of the flow request (and so of the flow) that ``slot`` of the schedule starts."""
    digest = hashlib.sha256(f"schedule\0{schedule_id}\0{round(slot * 1000)}".encode())
    return digest.hexdigest()[:32]


def slot_after(kind: str, spec: str, slot: float, after: float) -> float | None:
    """The first slot of the schedule later than ``after``, counting on from ``slot``.

    ``every`` keeps to the grid its first slot set; ``once`` has no slot after its one.
    """
    if kind == "once":
        return None
    if kind == "every":
        interval = float(spec)
        if after < slot:
            return slot
        steps = math.floor((after - slot) / interval) + 1
        while slot + steps * interval <= after:  # floating point: never at or before after
            steps += 1
        return slot + steps * interval
    found = float(
        croniter(spec, datetime.datetime.fromtimestamp(after, tz=datetime.UTC)).get_next(float)
    )
    while found <= after:
        found = float(
            croniter(spec, datetime.datetime.fromtimestamp(found, tz=datetime.UTC)).get_next(float)
        )
    return found


@attrs.frozen
class Firing:
    """What firing a due schedule does: start ``slot`` (None: nothing), go on at ``next_slot``."""

    slot: float | None
    next_slot: float | None


def plan_firing(schedule: ScheduleRow, now: float) -> Firing | None:
    """What to do for ``schedule`` at ``now``; None if no slot of it is due (a pure decision)."""
    due = schedule.next_slot
    if schedule.paused or due is None or due > now:
        return None
    latest = _latest_slot(schedule.kind, schedule.spec, due, now)
    following = slot_after(schedule.kind, schedule.spec, latest, now)
    on_time = now - latest <= GRACE_SECONDS
    fire = on_time or schedule.missed == "catch-up"
    return Firing(latest if fire else None, following)


def _latest_slot(kind: str, spec: str, due: float, now: float) -> float:
    """The latest slot at or before ``now``, given that ``due`` (at or before it) is one."""
    if kind == "once":
        return due
    if kind == "every":
        interval = float(spec)
        return due + math.floor((now - due) / interval) * interval
    moment = datetime.datetime.fromtimestamp(now + 0.001, tz=datetime.UTC)
    previous = float(croniter(spec, moment).get_prev(float))
    return max(previous, due)


class FlowScheduler:
    """Fires the due slots of a node's schedules (the node calls :meth:`fire_due`)."""

    def __init__(self, store: SqlSchedules, now: Callable[[], float]) -> None:
        self._store = store
        self._now = now

    def fire_due(self, partitions: Collection[int] | None = None) -> int:
        """Fire every due slot; returns how many flow requests it made.

        With ``partitions`` (a worker of a node run by several workers), only the schedules
        whose id falls in those partitions: each schedule is fired by one worker (firing is a
        compare-and-set, so two would still fire a slot once, but one does not race the
        other for nothing); the request it makes is started by its own flow's worker.
        """
        now = self._now()
        started = 0
        for schedule in self._store.due(now):
            if partitions is not None and partition_of(schedule.schedule_id) not in partitions:
                continue
            firing = plan_firing(schedule, now)
            if firing is None:
                continue
            request = None
            if firing.slot is not None:
                request_id = slot_request_id(schedule.schedule_id, firing.slot)
                request = FlowRequest(request_id, schedule.flow_class, schedule.arguments)
            fired = self._store.fire(schedule, request, firing.slot, firing.next_slot, now)
            started += int(fired and request is not None)
        return started


def make_schedule(
    flow: FlowLogic[Any],
    *,
    at: datetime.datetime | float | None = None,
    every: float | None = None,
    cron: str | None = None,
    schedule_id: str | None = None,
    missed: str = "skip",
    start: datetime.datetime | float | None = None,
    now: float | None = None,
    payloads: Serializer = PAYLOADS,
) -> ScheduleRow:
    """A new schedule for ``flow`` (checked: every problem named), ready to be stored.

    Exactly one of ``at`` (a time), ``every`` (seconds; the first slot is ``start``, default
    now plus ``every``) and ``cron`` (an expression; the first slot is its first after
    ``start`` or now) says when. ``schedule_id`` names it (default: the flow class's name
    and a number of the time).
    """
    cls = type(flow)
    if not isinstance(flow, FlowLogic):
        raise ScheduleError(f"only flows can be scheduled, not {flow!r}")
    problem = flow_class_name_problem(cls)
    if problem is None and not is_startable_by_rpc(cls):
        problem = "it is not marked @startable_by_rpc"
    if problem is not None:
        raise ScheduleError(f"{cls.__qualname__} cannot be scheduled: {problem}")
    if sum(x is not None for x in (at, every, cron)) != 1:
        raise ScheduleError("say when: exactly one of at=, every= and cron=")
    if missed not in MISSED_POLICIES:
        raise ScheduleError(f"missed must be one of {', '.join(MISSED_POLICIES)}, not {missed!r}")
    created = time.time() if now is None else now
    begin = created if start is None else _seconds(start, "start")
    if at is not None:
        kind, spec, first = "once", "", _seconds(at, "at")
        spec = str(first)
    elif every is not None:
        if isinstance(every, bool) or not isinstance(every, int | float) or not every > 0:
            raise ScheduleError(f"every must be a positive number of seconds, not {every!r}")
        kind, spec = "every", repr(float(every))
        first = begin if start is not None else created + float(every)
    else:
        assert cron is not None
        if len(str(cron)) > SCHEDULE_SPEC_CHARS:
            raise ScheduleError(f"a cron expression has at most {SCHEDULE_SPEC_CHARS} characters")
        if not isinstance(cron, str) or not croniter.is_valid(cron) or len(cron.split()) != 5:
            raise ScheduleError(
                f"cron {cron!r} is not a cron expression of five fields (minute hour "
                "day-of-month month day-of-week, UTC)"
            )
        kind, spec = "cron", cron
        found = slot_after("cron", cron, begin, begin)
        assert found is not None
        first = found
    name = schedule_id or f"{cls.__name__}-{int(created * 1000)}"
    if not _SCHEDULE_ID.match(name):
        raise ScheduleError(
            f"schedule id {name!r}: 1 to {SCHEDULE_ID_CHARS} letters, digits and . _ : -, "
            "starting with a letter or digit"
        )
    return ScheduleRow(
        schedule_id=name,
        flow_class=qualified_name(cls),
        arguments=encode_arguments(flow, payloads),
        kind=kind,
        spec=spec,
        missed=missed,
        next_slot=first,
        paused=False,
        fired=0,
        last_slot=None,
        created_at=created,
    )


def describe(row: ScheduleRow) -> str:
    """When ``row`` fires, in words (for listings)."""
    if row.kind == "once":
        return f"once at {_shown(float(row.spec))}"
    if row.kind == "every":
        return f"every {float(row.spec):g} s"
    return f"cron {row.spec!r} (UTC)"


def listing(rows: Sequence[ScheduleRow]) -> list[dict[str, Any]]:
    """One dict per schedule: id, flow, when, next slot, state, fired, missed policy."""
    return [
        {
            "schedule_id": row.schedule_id,
            "flow": row.flow_class.rsplit(".", 1)[-1],
            "when": describe(row),
            "next": "-" if row.next_slot is None else _shown(row.next_slot),
            "state": "paused" if row.paused else ("done" if row.next_slot is None else "active"),
            "fired": row.fired,
            "missed": row.missed,
        }
        for row in rows
    ]


def _seconds(value: datetime.datetime | float, name: str) -> float:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise ScheduleError(f"{name} must be an aware datetime (give it a timezone)")
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScheduleError(f"{name} must be a datetime or seconds since the epoch, not {value!r}")
    return float(value)


def _shown(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"
