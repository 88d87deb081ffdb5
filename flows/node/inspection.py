"""Operator commands against a node's database (``fiberflow flow ...``, ``checkpoints dump``).

Every command opens the node's existing database and never creates one: a missing SQLite
file or a schema without the node tables is one line naming the URL, exit status 2.
``flow list`` and ``checkpoints dump`` read the node's tables directly (the node may be running
or not). ``flow kill|pause|resume|retry`` and ``node drain|undrain`` queue a command in
``node_operator_requests``; the running node carries it out within a poll interval and
records the outcome, which the command waits for and prints.
"""

from __future__ import annotations

import base64
import datetime
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from flows.config.runtime import ConfigError, RuntimeConfig, load_config
from flows.network.identity import KeyFileError, load_or_create_identity
from foundation.engine import first_line, url_without_password
from foundation.serialization import PAYLOADS, SerializationError
from persistence import schema
from persistence.checkpoint_codec import decode_checkpoint
from persistence.lease import database_clock, read_assignment, read_holders
from persistence.migration import NodeDatabaseMissingError, SchemaVersionError
from persistence.store import NodeDatabase
from statemachine.partitions import partition_of, partition_ranges


def _database(config: RuntimeConfig, with_mac: bool = False) -> NodeDatabase:
    mac_key = None
    if with_mac and config.key_file is not None and config.key_file.exists():
        mac_key = load_or_create_identity(config.key_file, config.name).mac_key()
    return NodeDatabase(
        config.database_url, schema_name=config.database_schema, mac_key=mac_key, create=False
    )


def node_database(config: RuntimeConfig) -> NodeDatabase:
    """The node's existing database (never created: a missing one raises, naming the URL)."""
    return _database(config)


def _age(milliseconds: int) -> str:
    return age_text(time.time() - milliseconds / 1000)


def age_text(seconds: float) -> str:
    """An age as ``flow list`` shows it: ``42s``, ``17m``, ``3.5h``."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _waiting_on(suspended_on: str | None, waiting_for: str | None) -> str:
    if suspended_on is None or waiting_for is None:
        return "-"
    detail = json.loads(waiting_for)
    if suspended_on == "Sleep":
        until = datetime.datetime.fromtimestamp(detail["until"] / 1000, tz=datetime.UTC)
        return f"sleep until {until:%H:%M:%S}"
    if suspended_on == "Operation":
        name = detail["operation"].rpartition(".")[2]
        if detail["state"] == "backing off" and detail["until"] is not None:
            until = datetime.datetime.fromtimestamp(detail["until"] / 1000, tz=datetime.UTC)
            return f"operation {name}: attempt {detail['attempt']} at {until:%H:%M:%S}"
        return f"operation {name} (attempt {detail['attempt']})"
    names = sorted({w["counterparty"] or "?" for w in detail})
    return "receive from " + ", ".join(n.split(",")[0].removeprefix("O=") for n in names)


def _status(flow_id: str, stored: str, paused: set[str], busy: dict[str, tuple[int, str]]) -> str:
    if flow_id in busy:
        return "RUNNING"  # its code has run too long without suspending (see docs)
    return "PAUSED" if flow_id in paused else stored


def list_flows(config: RuntimeConfig) -> list[dict[str, Any]]:
    """One dict per flow with a checkpoint: id, class, status, waiting on, age, step.

    For a node run by several workers also ``worker``: the name of the worker holding the
    flow's partition (``-``: none now).
    """
    database = _database(config)
    table = schema.node_checkpoints
    try:
        with database.engine.connect() as connection:
            rows = connection.execute(select(table).order_by(table.c.created_at)).all()
        paused = database.control.paused_flows()
        busy = database.control.busy_flows()
        owners = partition_owners(database)
    finally:
        database.close()
    return [describe_flow_row(row, paused, busy, owners) for row in rows]


def describe_flow_row(
    row: Any,
    paused: set[str],
    busy: dict[str, tuple[int, str]],
    owners: dict[int, str] | None = None,
) -> dict[str, Any]:
    """A ``node_checkpoints`` row as ``flow list`` shows it (see :func:`list_flows`).

    ``paused`` and ``busy`` are the control plane's paused and busy flows; ``owners`` the
    worker holding each partition (:func:`partition_owners`), or None.
    """
    return {
        **({} if owners is None else {"worker": owners[partition_of(row.flow_id)]}),
        "flow_id": row.flow_id,
        "class": row.flow_class.rsplit(".", 1)[-1],
        "status": _status(row.flow_id, row.status, paused, busy),
        "waiting_on": (
            f"running {_age(busy[row.flow_id][0])} at {busy[row.flow_id][1]}"
            if row.flow_id in busy
            else _waiting_on(row.suspended_on, row.waiting_for)
        ),
        "age": _age(row.created_at),
        "step": row.progress_step or "-",
        "error": row.error_message,
    }


FAILED_SHOWN = 20
"""How many failed flows ``flow list`` shows without ``--all`` (the most recent)."""


def list_finished_flows(
    config: RuntimeConfig, everything: bool = False
) -> tuple[list[dict[str, Any]], int]:
    """Flows that ended without a checkpoint left, as :func:`list_flows` lists flows.

    The failed ones (a row in ``node_flow_exceptions``), newest first: the
    :data:`FAILED_SHOWN` most recent, or with ``everything`` all of them and the completed
    ones too (``node_flow_results``). Their ``error`` is ``Class: message``, ``error_class``
    the exception's qualified class, and ``age`` the time since they ended. Returns the flows
    and how many failed flows were left out.
    """
    failures, results = schema.node_flow_exceptions, schema.node_flow_results
    database = _database(config)
    try:
        with database.engine.connect() as connection:
            failed_count = connection.execute(
                select(func.count()).select_from(failures)
            ).scalar_one()
            query = select(failures).order_by(failures.c.failed_at.desc())
            if not everything:
                query = query.limit(FAILED_SHOWN)
            failed = connection.execute(query).all()
            completed = (
                connection.execute(
                    select(
                        results.c.flow_id, results.c.flow_class, results.c.completed_at
                    ).order_by(results.c.completed_at.desc())
                ).all()
                if everything
                else []
            )
    finally:
        database.close()
    flows = [
        finished_flow_row(
            row.flow_id,
            row.flow_class,
            "FAILED",
            row.failed_at,
            row.exception_class,
            row.message,
            row.traceback,
        )
        for row in failed
    ]
    flows += [
        finished_flow_row(row.flow_id, row.flow_class, "COMPLETED", row.completed_at)
        for row in completed
    ]
    return flows, failed_count - len(failed)


def finished_flow_row(
    flow_id: str,
    flow_class: str,
    status: str,
    ended_at: int,
    error_class: str | None = None,
    message: str = "",
    traceback: str | None = None,
) -> dict[str, Any]:
    """A row of ``flow list`` for a flow that has ended (its age: since it ended)."""
    error = None if error_class is None else f"{error_class.rsplit('.', 1)[-1]}: {message}"
    return {
        "flow_id": flow_id,
        "class": flow_class.rsplit(".", 1)[-1],
        "status": status,
        "waiting_on": "-",
        "age": _age(ended_at),
        "step": "-",
        "error": error,
        "error_class": error_class,
        "traceback": traceback,
    }


def print_flow_error(config: RuntimeConfig, flow_id: str) -> int:
    """``fiberflow flow error ID``: a failed flow's error and the traceback its node kept.

    Exit 0 if the flow failed, 1 if the node has no failed flow of that id.
    """
    failures = schema.node_flow_exceptions
    database = _database(config)
    try:
        with database.engine.connect() as connection:
            row = connection.execute(select(failures).where(failures.c.flow_id == flow_id)).first()
    finally:
        database.close()
    if row is None:
        print(f"fiberflow: no failed flow {flow_id} on {config.name}", file=sys.stderr)
        return 1
    print_failure(
        flow_id,
        row.flow_class,
        _age(row.failed_at),
        row.exception_class,
        row.message,
        row.traceback,
    )
    return 0


def print_failure(
    flow_id: str,
    flow_class: str,
    age: str,
    exception_class: str,
    message: str,
    traceback: str | None,
) -> None:
    """What ``flow error`` prints of a failed flow (from the database or the HTTP API)."""
    print(f"flow {flow_id} ({flow_class}) failed {age} ago:")
    print(f"{exception_class}: {message}")
    if traceback:
        print(traceback.rstrip())
    else:
        print("(no traceback: the flow was killed, refused, or failed before its code ran)")


def partition_owners(database: NodeDatabase) -> dict[int, str] | None:
    """The name of the worker holding each partition, if the node runs as several workers."""
    holders = {h.worker.worker_id: h for h in read_holders(database.engine)}
    if not any(h.shared for h in holders.values()):
        return None
    assignment = read_assignment(database.engine)
    return {
        partition: holders[holder].worker.name if holder in holders else "-"
        for partition, holder in assignment.items()
    }


def print_flow_list(config: RuntimeConfig, as_json: bool = False, everything: bool = False) -> int:
    """``fiberflow flow list``: a table of the node's flows and what its processes said.

    The flows with a checkpoint, then the failed ones (:func:`list_finished_flows`: the most
    recent, or with ``everything`` all of them and the completed ones). With ``as_json``, one
    JSON document instead: ``flows`` (the same rows), ``failed_not_shown`` and ``processes``
    (the report lines of :func:`process_reports`).
    """
    live = list_flows(config)
    finished, hidden = list_finished_flows(config, everything)
    return render_flow_list(
        live, finished, hidden, config.name, process_reports(config), as_json, "--config ..."
    )


def render_flow_list(
    live: list[dict[str, Any]],
    finished: list[dict[str, Any]],
    hidden: int,
    node_name: str,
    reports: list[str],
    as_json: bool = False,
    source: str = "--config ...",
) -> int:
    """Print ``flow list``'s table (or JSON document) of these rows; exit status 0.

    ``live`` and ``finished`` are rows as :func:`list_flows` and :func:`list_finished_flows`
    make them, ``hidden`` how many failed flows were left out, ``reports`` the processes'
    lines, ``source`` how ``flow error`` reaches the node (``--config ...``, ``--url ...``).
    """
    if as_json:
        document = {"flows": live + finished, "failed_not_shown": hidden, "processes": reports}
        print(json.dumps(document, indent=2))
        return 0
    flows = live + finished
    header: tuple[str, ...] = ("FLOW ID", "CLASS", "STATUS", "WAITING ON", "AGE", "PROGRESS STEP")
    keys = ["flow_id", "class", "status", "waiting_on", "age", "step"]
    if any("worker" in f for f in flows):
        header += ("WORKER",)
        keys.append("worker")
    lines = [header] + [tuple(f.get(key, "-") for key in keys) for f in flows]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)))
    hospitalized = [f for f in flows if f["status"] == "HOSPITALIZED"]
    for flow in hospitalized:
        print(f"{flow['flow_id']} is in the hospital: {flow['error']}")
    for flow in finished:
        if flow["status"] == "FAILED":
            print(f"{flow['flow_id']} failed: {flow['error']}")
    if any(f["status"] == "FAILED" and f.get("traceback") for f in finished):
        print(f"(fiberflow flow error ID {source} prints a failed flow's traceback)")
    print(f"{len(live)} flow(s) with a checkpoint on {node_name}{_by_kind(live)}")
    failed = sum(1 for f in finished if f["status"] == "FAILED") + hidden
    if failed:
        shown = (
            f"the {failed - hidden} most recent shown; --all lists every one"
            if hidden
            else "shown above"
        )
        print(f"{failed} failed flow(s) ({shown})")
    for line in reports:
        print(line)
    return 0


def _by_kind(flows: list[dict[str, Any]]) -> str:
    """How many flows wait on what (and the others' statuses), for the list's last line."""
    kinds: dict[str, int] = {}
    for flow in flows:
        kind = str(flow["status"]).lower()
        if flow["status"] == "SUSPENDED":
            kind = "waiting on " + _WAITS.get(str(flow["waiting_on"]).split(" ", 1)[0], "?")
        kinds[kind] = kinds.get(kind, 0) + 1
    if not kinds:
        return ""
    return ": " + ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))


_WAITS = {"receive": "a receive", "sleep": "a sleep", "operation": "an operation"}


def process_reports(config: RuntimeConfig) -> list[str]:
    """One line per live process of the node: who it is and what it last said of its flows.

    From the processes' rows in ``node_workers``: a process's report rides on its lease
    renewals (every second for a worker of a node run by several workers, every third of the
    lease otherwise).
    """
    database = _database(config)
    try:
        holders = read_holders(database.engine)
        assignment = read_assignment(database.engine)
        now = database_clock(database.engine)
    finally:
        database.close()
    lines = []
    for holder in holders:
        if holder.expires_at <= now:
            continue  # a dead process's row, not taken over yet
        held = sorted(p for p, w in assignment.items() if w == holder.worker.worker_id)
        who = f"worker {holder.worker.name!r}" if holder.shared else "the node"
        where = f"pid {holder.worker.pid} on host {holder.worker.host}"
        if holder.shared:
            where += f", partitions {partition_ranges(held)}"
        lines.append(f"{who} ({where}) reported {_counts_text(holder.flow_counts)}")
    return lines


def _counts_text(text: str | None) -> str:
    if text is None:
        return "nothing yet"
    counts = json.loads(text)
    waiting = ", ".join(f"{n} on {k}" for k, n in sorted(counts["waiting_in_memory"].items()))
    return (
        f"({_age(int(counts['at'] * 1000))} ago): "
        f"{counts['in_memory'] + counts['dormant']} live, {counts['in_memory']} in memory"
        f"{f' (waiting: {waiting})' if waiting else ''}, {counts['dormant']} hibernated or not "
        f"restored since its start, {counts['restoring']} being restored"
    )


def request_operation(
    config: RuntimeConfig, action: str, flow_id: str | None, timeout: float
) -> int:
    """Queue an operator command, wait for the node to carry it out, print the outcome."""
    database = _database(config)
    try:
        outcome = await_operation(database, action, flow_id, timeout)
    finally:
        database.close()
    if outcome is not None:
        succeeded = operation_succeeded(outcome)
        print(outcome, file=sys.stdout if succeeded else sys.stderr)
        return 0 if succeeded else 1
    print(
        f"{action} {flow_id or ''}: the node did not carry it out within {timeout:.0f} s "
        "(is it running?); the command stays queued and runs when the node starts",
        file=sys.stderr,
    )
    return 3


def await_operation(
    database: NodeDatabase,
    action: str,
    flow_id: str | None,
    timeout: float,
    should_stop: Callable[[], bool] = lambda: False,
) -> str | None:
    """Queue an operator command and wait for the node's outcome (None: not within timeout).

    The command stays queued if the node does not carry it out in time: it runs when the
    node next polls. ``should_stop`` ends the wait early (None is returned).
    """
    request_id = database.control.request_operation(action, flow_id, time.time())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not should_stop():
        outcome = database.control.operation_outcome(request_id)
        if outcome is not None:
            return outcome
        time.sleep(0.05)
    return None


def operation_succeeded(outcome: str) -> bool:
    """True if a node's outcome of an operator command says it was done."""
    return outcome.startswith(("ok", "draining", "accepting"))


def _plain(value: Any) -> Any:
    """A JSON-friendly form of checkpoint parts (payload bytes decoded where possible)."""
    if isinstance(value, bytes):
        try:
            return {"payload": repr(PAYLOADS.decode(value))}
        except SerializationError:
            return {"bytes_base64": base64.b64encode(value).decode()}
    if attrs.has(type(value)):
        document = {"type": type(value).__name__}
        for field in attrs.fields(type(value)):
            document[field.name] = _plain(getattr(value, field.name))
        return document
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "value") and hasattr(value, "name"):  # an enum
        return value.value
    return value


def dump_checkpoint(config: RuntimeConfig, flow_id: str) -> dict[str, Any]:
    """The checkpoint of ``flow_id`` as plain JSON data (MAC checked when the key is there)."""
    database = _database(config, with_mac=True)
    try:
        return checkpoint_document(database, config.name, flow_id)
    finally:
        database.close()


def checkpoint_document(database: NodeDatabase, node_name: str, flow_id: str) -> dict[str, Any]:
    """What :func:`dump_checkpoint` returns, read from an open node database.

    Raises KeyError if the flow has no checkpoint. The MAC is checked if ``database`` was
    opened with the node's key.
    """
    rows, blobs = schema.node_checkpoints, schema.node_checkpoint_blobs
    with database.engine.connect() as connection:
        row = connection.execute(
            select(rows, blobs.c.blob, blobs.c.mac)
            .join(blobs, blobs.c.flow_id == rows.c.flow_id)
            .where(rows.c.flow_id == flow_id)
        ).first()
    if row is None:
        raise KeyError(f"no checkpoint for flow {flow_id} on {node_name}")
    expected = database.checkpoints.checkpoint_mac(flow_id, row.checkpoint_version, row.blob)
    paused = database.control.paused_flows()
    busy = database.control.busy_flows()
    if expected is None:
        integrity = "not checked (no key file)"
    elif row.mac == expected:
        integrity = "MAC ok"
    else:
        integrity = "MAC MISMATCH: the blob was changed outside the node"
    document: dict[str, Any] = {
        "flow_id": flow_id,
        "flow_class": row.flow_class,
        "status": _status(flow_id, row.status, paused, busy),  # as flow list shows it
        "stored_status": row.status,
        "progress_step": row.progress_step,
        "error": row.error_message,
        "checkpoint_bytes": row.checkpoint_bytes,
        "integrity": integrity,
    }
    try:
        checkpoint = decode_checkpoint(row.blob)
    except SerializationError as error:
        document["undecodable"] = str(error)
        return document
    document["origin"] = _plain(checkpoint.origin)
    document["sessions"] = _plain(tuple(checkpoint.sessions))
    document["journal"] = [
        {"step": index + 1, "request": list(entry.signature), "outcome": _plain(entry.outcome)}
        for index, entry in enumerate(checkpoint.journal)
    ]
    document["pending"] = _plain(checkpoint.pending)
    return document


def run_operator_command(args: Any) -> int:
    """Dispatch ``fiberflow flow|checkpoints|outbox|node drain`` sub-commands."""
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"fiberflow: {error}", file=sys.stderr)
        return 2
    try:
        if args.command == "checkpoints":
            print(json.dumps(dump_checkpoint(config, args.flow_id), indent=2, default=str))
            return 0
        if args.command == "outbox":
            from flows.cli.outbox import drop_peer_rows, print_outbox_rows

            database = _database(config)
            try:
                if args.outbox_command == "drop":
                    return drop_peer_rows(config, database, args.peer)
                return print_outbox_rows(config, database, args.json, args.limit)
            finally:
                database.close()
        if args.command == "node" and args.node_command == "outbox":
            from flows.cli.peer import print_outbox

            database = _database(config)
            try:
                return print_outbox(config, database)
            finally:
                database.close()
        if args.command == "node":
            return request_operation(config, args.node_command, None, args.timeout)
        if args.flow_command == "error":
            return print_flow_error(config, args.flow_id)
        if args.flow_command == "list":
            return print_flow_list(config, as_json=args.json, everything=args.all)
        return request_operation(config, args.flow_command, args.flow_id, args.timeout)
    except (KeyError, KeyFileError) as error:
        print(f"fiberflow: {error.args[0] if error.args else error}", file=sys.stderr)
        return 1
    except (NodeDatabaseMissingError, SchemaVersionError) as error:
        print(f"fiberflow: {error}", file=sys.stderr)
        return 2
    except (SQLAlchemyError, OSError) as error:
        url = url_without_password(config.database_url)
        print(f"fiberflow: cannot use the database {url}: {first_line(error)}", file=sys.stderr)
        return 2
