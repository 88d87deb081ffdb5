"""``NodeClient``: start flows on a running node process and collect their outcomes.

A node process reads its flow requests from its own database (``node_flow_requests``), so a
client needs only the node's database URL: ``start_flow`` commits a request and returns the
flow id the node will give the flow (the request id: asking twice starts it once);
``wait`` polls ``node_flow_results`` / ``node_flow_exceptions`` until the flows finish.

It is for local use (tests, scripts on the node's own machine): whoever uses it holds the node
database's rights, and it starts any flow of the node, ``@startable_by_rpc`` or not. A client
from elsewhere uses the node's HTTP API as one of its users instead:
:class:`flows.rpc.client.RpcClient` (the same shape; docs/rpc.md).
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from flows.errors import FiberflowError, exception_from_error
from flows.flow_logic import FlowLogic
from flows.node.flow_requests import encode_arguments
from flows.node.schedules import make_schedule
from foundation.serialization import PAYLOADS, qualified_name
from persistence.node_store import FlowRequest, StoredOutcome
from persistence.schedule_store import ScheduleRow
from persistence.store import NodeDatabase
from statemachine.limits import FLOW_ID_CHARS

OutcomeT = TypeVar("OutcomeT")
"""A flow's outcome, as a client represents it."""


class FlowWaitTimeoutError(FiberflowError):
    """``NodeClient.wait`` ran out of time; the message says how many flows were unfinished."""


def wait_for_outcomes(
    outcomes: Callable[[Sequence[str]], Mapping[str, OutcomeT]],
    flow_ids: Sequence[str],
    timeout: float,
    on_progress: Callable[[int, int], None] | None,
    poll_seconds: float,
) -> dict[str, OutcomeT]:
    """Poll ``outcomes`` (those of the flows that have finished) until every flow finished.

    ``on_progress(done, total)`` is called after each poll. Raises
    :class:`FlowWaitTimeoutError` after ``timeout`` seconds, naming one flow still running.
    Shared by :meth:`NodeClient.wait` and :meth:`flows.rpc.client.RpcClient.wait`.
    """
    deadline = time.monotonic() + timeout
    finished: dict[str, OutcomeT] = {}
    remaining = list(flow_ids)
    while True:
        finished.update(outcomes(remaining))
        remaining = [f for f in remaining if f not in finished]
        if on_progress is not None:
            on_progress(len(finished), len(flow_ids))
        if not remaining:
            return finished
        if time.monotonic() > deadline:
            raise FlowWaitTimeoutError(
                f"{len(remaining)} of {len(flow_ids)} flows had not finished after "
                f"{timeout:.0f} s (for example {remaining[0]})"
            )
        time.sleep(poll_seconds)


class NodeClient:
    """A client of one node process, through the node's database (local use; see above).

    Over the network, use :class:`flows.rpc.client.RpcClient`: it needs a user of the
    node's ``[rpc]`` section, not the database's rights.
    """

    def __init__(self, database_url: str, *, database_schema: str | None = None) -> None:
        """Open the node's existing database (a client never creates one).

        Raises :class:`~persistence.migration.NodeDatabaseMissingError` naming the URL if
        there is no node database there (a missing SQLite file, a database or schema without
        the node tables: a typo, or a node that never ran), and
        :class:`~persistence.migration.SchemaVersionError` for another schema version.
        """
        self.database = NodeDatabase(database_url, schema_name=database_schema, create=False)

    def start_flow(self, flow: FlowLogic[Any], request_id: str | None = None) -> str:
        """Ask the node to start ``flow``; returns its flow id."""
        return self.start_flows([flow], [request_id or uuid.uuid4().hex])[0]

    def start_flows(
        self, flows: Sequence[FlowLogic[Any]], request_ids: Sequence[str] | None = None
    ) -> list[str]:
        """Ask the node to start several flows (one transaction); returns their flow ids."""
        ids = list(request_ids) if request_ids is not None else [uuid.uuid4().hex for _ in flows]
        if len(ids) != len(flows):
            raise ValueError(f"{len(flows)} flows but {len(ids)} request ids")
        requests = []
        for flow, request_id in zip(flows, ids, strict=True):
            if not isinstance(flow, FlowLogic):
                raise TypeError(f"start_flow needs a FlowLogic instance, not {type(flow)}")
            if not isinstance(request_id, str) or not 0 < len(request_id) <= FLOW_ID_CHARS:
                raise ValueError(
                    f"request id {str(request_id)[:80]!r} must be a string of 1 to "
                    f"{FLOW_ID_CHARS} characters (it becomes the flow id)"
                )
            requests.append(
                FlowRequest(request_id, qualified_name(type(flow)), encode_arguments(flow))
            )
        self.database.control.request_flows(requests, time.time())
        return ids

    def outcomes(self, flow_ids: Sequence[str]) -> dict[str, StoredOutcome]:
        """The outcomes of those flows that have finished."""
        return self.database.checkpoints.stored_outcomes(flow_ids)

    def wait(
        self,
        flow_ids: Sequence[str],
        timeout: float,
        on_progress: Callable[[int, int], None] | None = None,
        poll_seconds: float = 0.05,
    ) -> dict[str, StoredOutcome]:
        """Wait until every flow finished; ``on_progress(done, total)`` is called as they do."""
        return wait_for_outcomes(self.outcomes, flow_ids, timeout, on_progress, poll_seconds)

    def result(self, flow_id: str) -> Any:
        """The result of a finished flow (raises its error); KeyError if not finished."""
        outcome = self.outcomes([flow_id]).get(flow_id)
        if outcome is None:
            raise KeyError(f"flow {flow_id} has not finished (or does not exist)")
        return decode_outcome(outcome)

    # --- schedules (flows.node.schedules) --------------------------------------------------------

    def schedule_flow(
        self,
        flow: FlowLogic[Any],
        *,
        at: datetime.datetime | float | None = None,
        every: float | None = None,
        cron: str | None = None,
        schedule_id: str | None = None,
        missed: str = "skip",
        start: datetime.datetime | float | None = None,
    ) -> str:
        """Have the node start ``flow`` on a schedule; returns the schedule's id.

        Exactly one of ``at`` (a time), ``every`` (seconds) and ``cron`` (five fields, UTC)
        says when; ``missed`` (``skip`` or ``catch-up``) what to do with slots the node
        missed; ``start`` when an ``every`` or ``cron`` schedule begins (default: now). The
        flow class must be ``@startable_by_rpc``. Raises ``ScheduleError`` naming a problem,
        ``ScheduleExistsError`` if ``schedule_id`` is taken.
        """
        row = make_schedule(
            flow,
            at=at,
            every=every,
            cron=cron,
            schedule_id=schedule_id,
            missed=missed,
            start=start,
        )
        self.database.schedules.add(row)
        return row.schedule_id

    def schedules(self) -> list[ScheduleRow]:
        """The node's schedules, by id."""
        return self.database.schedules.all()

    def pause_schedule(self, schedule_id: str) -> None:
        """Fire no slot of the schedule until it is resumed (KeyError if unknown)."""
        self.database.schedules.set_paused(schedule_id, True)

    def resume_schedule(self, schedule_id: str) -> None:
        """Let a paused schedule fire again; slots missed meanwhile follow its policy."""
        self.database.schedules.set_paused(schedule_id, False)

    def remove_schedule(self, schedule_id: str) -> None:
        """Remove the schedule (KeyError if unknown); flows it started are not touched."""
        self.database.schedules.remove(schedule_id)

    def close(self) -> None:
        """Release the database connections."""
        self.database.close()


def decode_outcome(outcome: StoredOutcome) -> Any:
    """A stored outcome's result, or its error raised."""
    if outcome.error is not None:
        raise exception_from_error(outcome.error, outcome.traceback)
    assert outcome.result is not None
    return PAYLOADS.decode(outcome.result)
