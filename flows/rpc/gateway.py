"""What the API reads and writes in the node database; the HTTP thread's only way in.

The API never touches the state machine. A start is a row in ``node_flow_requests`` (as
:class:`flows.node.client.NodeClient` writes it), which the node's loop starts or refuses
(:mod:`flows.node.flow_requests`); an operation is a row in ``node_operator_requests``, whose
outcome the node records (:func:`flows.node.operator_commands.await_operation`); everything
else is a read of the node's tables, shaped by the functions ``fiberflow flow list`` and
``checkpoints dump`` use (:mod:`flows.node.inspection`).
"""

from __future__ import annotations

import hashlib
import heapq
import importlib.metadata
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import attrs
from sqlalchemy import func, select

from flows.config.rpc import RpcUser
from flows.cordapps import Cordapps
from flows.markings import is_startable_by_rpc, responder_initiator
from flows.node.inspection import checkpoint_document, describe_flow_row, partition_owners
from flows.node.operator_commands import await_operation, operation_succeeded
from flows.rpc.arguments import build_flow
from flows.rpc.outcomes import iso_time, outcome_document
from persistence import schema
from persistence.node_store import FlowRequest
from persistence.store import NodeDatabase
from statemachine.limits import FLOW_ID_CHARS

MAX_CLIENT_REQUEST_ID_CHARS = 200
"""The longest ``client_request_id`` a start may carry."""
MAX_PAGE = 500
"""The most flows one page of ``GET /api/flows`` lists."""
DEFAULT_PAGE = 100
FLOW_ACTIONS = ("kill", "pause", "resume", "retry")
"""Operations on one flow (the ``operate`` permission)."""
NODE_ACTIONS = ("drain", "undrain")
"""Operations on the node (the ``operate`` permission)."""
_BATCH = 500


class ApiError(Exception):
    """A request the API refuses: its HTTP status and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen
class Started:
    """The answer to a start: 201 for a new flow, 200 for a repeated request id."""

    created: bool
    document: dict[str, Any]


@attrs.frozen
class ListQuery:
    """The filters and page of ``GET /api/flows``."""

    statuses: frozenset[str] = frozenset()
    flow_class: str | None = None
    min_age: float | None = None
    max_age: float | None = None
    finished: bool = False
    limit: int = DEFAULT_PAGE
    after: str = ""


class NodeGateway:
    """The node database as the API uses it (see the module docstring)."""

    def __init__(
        self,
        database: NodeDatabase,
        node_name: str,
        cordapps: Cordapps,
        *,
        ready: Callable[[], bool] = lambda: False,
        process_info: Callable[[], dict[str, Any]] = dict,
        operation_timeout: float = 30.0,
    ) -> None:
        """A gateway to ``database``, the database of node ``node_name``.

        ``ready`` says whether the node process holds its lease and serves;
        ``process_info`` what the process says of itself (its lease, partitions, worker);
        operations wait ``operation_timeout`` seconds for the node's outcome.
        """
        self.database = database
        self.node_name = node_name
        self.cordapps = cordapps
        self.ready = ready
        self.process_info = process_info
        self.operation_timeout = operation_timeout
        self.closing = threading.Event()
        """Set when the server stops: open streams and waits end."""

    # --- starting flows ---------------------------------------------------------------------

    def start(
        self,
        user: RpcUser,
        flow_class: str,
        arguments: dict[str, Any],
        client_request_id: str | None,
    ) -> Started:
        """Ask the node to start a flow for ``user``; ApiError says why not.

        With ``client_request_id`` the start is idempotent per user: the same id with the
        same class and arguments answers the same flow, with others 409.
        """
        if not user.may_start(flow_class):
            raise ApiError(403, f"user {user.name} may not start {flow_class}")
        cls = self.cordapps.flow_class(flow_class)
        if cls is None:
            raise ApiError(400, f"{flow_class} is not a flow of node {self.node_name}")
        if responder_initiator(cls) is not None:
            raise ApiError(403, f"{flow_class} is a responder flow: it cannot be started")
        if not is_startable_by_rpc(cls):
            raise ApiError(403, f"{flow_class} is not marked @startable_by_rpc")
        _, encoded = build_flow(cls, arguments)
        if self.database.control.setting("draining") == "true":
            raise ApiError(503, f"node {self.node_name} is draining: it starts no new flows")
        if client_request_id is None:
            flow_id = uuid.uuid4().hex
        else:
            flow_id = request_flow_id(user.name, client_request_id)
            existing = self._request(flow_id)
            if existing is not None:
                _check_same(existing, flow_class, encoded, flow_id)
                return Started(False, _started(flow_id, flow_class, client_request_id, True))
        request = FlowRequest(flow_id, flow_class, encoded)
        self.database.control.request_flows([request], time.time())
        stored = self._request(flow_id)
        if stored is not None:
            _check_same(stored, flow_class, encoded, flow_id)  # another start raced this one
        return Started(True, _started(flow_id, flow_class, client_request_id, False))

    def _request(self, flow_id: str) -> Any:
        table = schema.node_flow_requests
        with self.database.engine.connect() as connection:
            return connection.execute(
                select(table.c.flow_class, table.c.arguments).where(table.c.request_id == flow_id)
            ).first()

    # --- reading flows ----------------------------------------------------------------------

    def list_flows(self, query: ListQuery) -> dict[str, Any]:
        """One page of flows in flow id order: ``{"flows": [...], "next": cursor or null}``."""
        control = self.database.control
        paused, busy = control.paused_flows(), control.busy_flows()
        owners = partition_owners(self.database)
        now = time.time() * 1000
        sources = [self._live(paused, busy, owners, query.after)]
        if query.finished:
            sources += [self._failed(query.after), self._completed(query.after)]
        page: list[dict[str, Any]] = []
        last = None
        for flow_id, item in heapq.merge(*sources, key=lambda pair: pair[0]):
            if flow_id == last:
                continue  # a flow that just finished: its checkpoint row is going
            last = flow_id
            if _matches(item, query, now):
                if len(page) == query.limit:
                    return {"flows": page, "next": page[-1]["flow_id"]}
                page.append(item)
        return {"flows": page, "next": None}

    def _rows(self, table: Any, after: str, columns: tuple[Any, ...] = ()) -> Iterator[Any]:
        """The rows of ``table`` past ``after``, by flow id, read in batches."""
        while True:
            query = select(*columns) if columns else select(table)
            query = query.where(table.c.flow_id > after).order_by(table.c.flow_id).limit(_BATCH)
            with self.database.engine.connect() as connection:
                rows = connection.execute(query).all()
            yield from rows
            if len(rows) < _BATCH:
                return
            after = rows[-1].flow_id

    def _live(
        self,
        paused: set[str],
        busy: dict[str, tuple[int, str]],
        owners: dict[int, str] | None,
        after: str,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        for row in self._rows(schema.node_checkpoints, after):
            shown = describe_flow_row(row, paused, busy, owners)
            yield (
                row.flow_id,
                {
                    "flow_id": row.flow_id,
                    "class": row.flow_class,
                    "status": shown["status"],
                    "progress_step": row.progress_step,
                    "waiting_on": shown["waiting_on"],
                    "created_at": iso_time(row.created_at),
                    "updated_at": iso_time(row.updated_at),
                    "ended_at": None,
                    "error": row.error_message,
                    **({"worker": shown["worker"]} if "worker" in shown else {}),
                    "_time": row.created_at,
                },
            )

    def _failed(self, after: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for row in self._rows(schema.node_flow_exceptions, after):
            yield (
                row.flow_id,
                _ended(
                    row.flow_id,
                    row.flow_class,
                    "FAILED",
                    row.failed_at,
                    f"{row.exception_class}: {row.message}",
                ),
            )

    def _completed(self, after: str) -> Iterator[tuple[str, dict[str, Any]]]:
        table = schema.node_flow_results
        columns = (table.c.flow_id, table.c.flow_class, table.c.completed_at)
        for row in self._rows(table, after, columns):
            yield row.flow_id, _ended(row.flow_id, row.flow_class, "COMPLETED", row.completed_at)

    def flow(self, flow_id: str) -> dict[str, Any]:
        """One flow: status, progress, sessions and what it waits on, or its outcome.

        ApiError 404 if the node has no such flow (nor a request for it).
        """
        outcome = self.database.checkpoints.stored_outcomes([flow_id]).get(flow_id)
        if outcome is not None:
            failed = outcome.error is not None
            return flow_document(
                flow_id,
                outcome.flow_class,
                "FAILED" if failed else "COMPLETED",
                ended_at=iso_time(self._ended_at(flow_id)),
                error=outcome.error.message if outcome.error is not None else None,
                outcome=outcome_document(outcome),
            )
        try:
            document = checkpoint_document(self.database, self.node_name, flow_id)
        except KeyError:
            request = self._request(flow_id)
            if request is None:
                raise ApiError(404, f"no flow {flow_id} on {self.node_name}") from None
            return flow_document(flow_id, request.flow_class, "REQUESTED")
        row = self._checkpoint_row(flow_id)
        control = self.database.control
        shown = (
            describe_flow_row(row, control.paused_flows(), control.busy_flows())
            if row is not None
            else {"waiting_on": "-"}
        )
        return flow_document(
            flow_id,
            document["flow_class"],
            document["status"],
            progress_step=document["progress_step"],
            waiting_on=shown["waiting_on"],
            created_at=iso_time(row.created_at) if row is not None else None,
            updated_at=iso_time(row.updated_at) if row is not None else None,
            error=document["error"],
            sessions=document.get("sessions", []),
            pending=document.get("pending"),
            origin=document.get("origin"),
            integrity=document["integrity"],
            progress_steps=progress_steps(document.get("journal", [])),
        )

    def progress(self, flow_id: str) -> tuple[str | None, str | None, dict[str, Any] | None]:
        """What the progress stream needs: (status, progress step, outcome document or None).

        ApiError 404 if the node has no such flow nor a request for it.
        """
        outcome = self.database.checkpoints.stored_outcomes([flow_id]).get(flow_id)
        if outcome is not None:
            status = "FAILED" if outcome.error is not None else "COMPLETED"
            return status, None, outcome_document(outcome)
        row = self._checkpoint_row(flow_id)
        if row is not None:
            return row.status, row.progress_step, None
        if self._request(flow_id) is not None:
            return "REQUESTED", None, None
        raise ApiError(404, f"no flow {flow_id} on {self.node_name}")

    def _checkpoint_row(self, flow_id: str) -> Any:
        table = schema.node_checkpoints
        with self.database.engine.connect() as connection:
            return connection.execute(select(table).where(table.c.flow_id == flow_id)).first()

    def _ended_at(self, flow_id: str) -> int | None:
        results, failures = schema.node_flow_results, schema.node_flow_exceptions
        with self.database.engine.connect() as connection:
            found = connection.execute(
                select(results.c.completed_at).where(results.c.flow_id == flow_id)
            ).scalar()
            if found is None:
                found = connection.execute(
                    select(failures.c.failed_at).where(failures.c.flow_id == flow_id)
                ).scalar()
        return found

    # --- operations -------------------------------------------------------------------------

    def operate(self, action: str, flow_id: str | None) -> dict[str, Any]:
        """Have the node carry out an operator command; its outcome, or ApiError.

        404 for a flow without a checkpoint, 409 when the node refused the command (its
        outcome is the message), 504 when the node did not answer in time (the command stays
        queued).
        """
        if flow_id is not None and self._checkpoint_row(flow_id) is None:
            raise ApiError(404, f"no live flow {flow_id} on {self.node_name}")
        outcome = await_operation(
            self.database, action, flow_id, self.operation_timeout, self.closing.is_set
        )
        if outcome is None:
            raise ApiError(
                504,
                f"{action}: the node did not carry it out within {self.operation_timeout:g} s "
                "(is it running?); the command stays queued",
            )
        if not operation_succeeded(outcome):
            raise ApiError(409, outcome.removeprefix("error: "))
        return {"action": action, "flow_id": flow_id, "outcome": outcome}

    # --- the node ---------------------------------------------------------------------------

    def node_info(self) -> dict[str, Any]:
        """The node's name, version, process, draining flag and flow counts."""
        table = schema.node_checkpoints
        with self.database.engine.connect() as connection:
            counted = select(table.c.status, func.count()).group_by(table.c.status)
            by_status: dict[str, int] = {
                status: count for status, count in connection.execute(counted).all()
            }
            completed = connection.execute(
                select(func.count()).select_from(schema.node_flow_results)
            ).scalar_one()
            failed = connection.execute(
                select(func.count()).select_from(schema.node_flow_exceptions)
            ).scalar_one()
        return {
            "name": self.node_name,
            "version": _version(),
            "ready": self.ready(),
            "draining": self.database.control.setting("draining") == "true",
            "process": self.process_info(),
            "flows": {
                "live": sum(by_status.values()),
                "by_status": by_status,
                "paused": len(self.database.control.paused_flows()),
                "completed_kept": completed,
                "failed_kept": failed,
            },
            "startable": [
                name
                for name in self.cordapps.flow_classes()
                if is_startable_by_rpc(self.cordapps.flow_class(name) or object)
            ],
        }


def flow_document(
    flow_id: str,
    flow_class: str,
    status: str,
    *,
    progress_step: str | None = None,
    waiting_on: str | None = None,
    created_at: str | None = None,
    updated_at: str | None = None,
    ended_at: str | None = None,
    error: str | None = None,
    sessions: list[Any] | None = None,
    pending: Any = None,
    origin: Any = None,
    integrity: str | None = None,
    outcome: dict[str, Any] | None = None,
    progress_steps: list[str] | None = None,
) -> dict[str, Any]:
    """``GET /api/flows/{id}``: the same keys whatever the flow's state (see docs/rpc.md)."""
    return {
        "flow_id": flow_id,
        "class": flow_class,
        "status": status,
        "progress_step": progress_step,
        "progress_steps": progress_steps if progress_steps is not None else [],
        "waiting_on": waiting_on,
        "created_at": created_at,
        "updated_at": updated_at,
        "ended_at": ended_at,
        "error": error,
        "sessions": sessions if sessions is not None else [],
        "pending": pending,
        "origin": origin,
        "integrity": integrity,
        "outcome": outcome,
    }


def progress_steps(journal: list[dict[str, Any]]) -> list[str]:
    """The progress steps a live flow went through, in order (its journal's SetProgress)."""
    return [
        str(entry["request"][1])
        for entry in journal
        if entry.get("request") and entry["request"][0] == "SetProgress"
    ]


def request_flow_id(user: str, client_request_id: str) -> str:
    """The flow id of a start with ``client_request_id``: the same per user, never another's."""
    digest = hashlib.sha256(f"{user}\0{client_request_id}".encode()).hexdigest()
    flow_id = f"rpc-{digest[:48]}"
    assert len(flow_id) <= FLOW_ID_CHARS
    return flow_id


def _check_same(existing: Any, flow_class: str, encoded: bytes, flow_id: str) -> None:
    """Raise 409 unless the stored request is for the same class and arguments."""
    if existing.flow_class != flow_class or bytes(existing.arguments) != encoded:
        raise ApiError(
            409,
            f"client_request_id was used for another start (flow {flow_id}, "
            f"{existing.flow_class}): use a new id for a new flow",
        )


def _started(
    flow_id: str, flow_class: str, client_request_id: str | None, repeated: bool
) -> dict[str, Any]:
    return {
        "flow_id": flow_id,
        "class": flow_class,
        "client_request_id": client_request_id,
        "repeated": repeated,
        "links": {"flow": f"/api/flows/{flow_id}", "events": f"/api/flows/{flow_id}/events"},
    }


def _ended(
    flow_id: str, flow_class: str, status: str, ended_at: int, error: str | None = None
) -> dict[str, Any]:
    return {
        "flow_id": flow_id,
        "class": flow_class,
        "status": status,
        "progress_step": None,
        "waiting_on": None,
        "created_at": None,
        "updated_at": None,
        "ended_at": iso_time(ended_at),
        "error": error,
        "_time": ended_at,
    }


def _matches(item: dict[str, Any], query: ListQuery, now_ms: float) -> bool:
    """True if a listed flow passes the query's filters (and drops its private time)."""
    moment = item.pop("_time")
    if query.statuses and item["status"] not in query.statuses:
        return False
    wanted = query.flow_class
    if wanted is not None and item["class"] != wanted and not item["class"].endswith("." + wanted):
        return False
    age = max(0.0, (now_ms - moment) / 1000)
    if query.min_age is not None and age < query.min_age:
        return False
    if query.max_age is not None and age > query.max_age:
        return False
    item["age_seconds"] = round(age, 3)
    return True


def _version() -> str:
    try:
        return importlib.metadata.version("fiberflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
