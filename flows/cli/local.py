"""The flow, checkpoint, outbox and node commands run against a node's database (``--config``).

``fiberflow flow list|error|kill|pause|resume|retry``, ``checkpoints dump``, ``outbox list|drop``
and ``node drain|undrain|outbox``. Every command opens the node's existing database and never
creates one: a missing SQLite file or a schema without the node tables is one line naming the
URL, exit status 2. ``flow list`` and ``checkpoints dump`` read the node's tables directly
(:mod:`flows.node.inspection`; the node may be running or not). ``flow kill|pause|resume|retry``
and ``node drain|undrain`` queue an operator command (:mod:`flows.node.operator_commands`); the
running node carries it out within a poll interval and records the outcome, which the command
waits for and prints. (With ``--url`` the same commands go through the node's HTTP API:
:mod:`flows.cli.flow`.)
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from flows.config.runtime import ConfigError, RuntimeConfig, load_config
from flows.network.identity import KeyFileError
from flows.node.inspection import (
    age_since,
    dump_checkpoint,
    list_finished_flows,
    list_flows,
    node_database,
    process_reports,
)
from flows.node.operator_commands import await_operation, operation_succeeded
from foundation.engine import first_line, url_without_password
from persistence import schema
from persistence.migration import NodeDatabaseMissingError, SchemaVersionError


def print_flow_error(config: RuntimeConfig, flow_id: str) -> int:
    """``fiberflow flow error ID``: a failed flow's error and the traceback its node kept.

    Exit 0 if the flow failed, 1 if the node has no failed flow of that id.
    """
    failures = schema.node_flow_exceptions
    database = node_database(config)
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
        age_since(row.failed_at),
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


def request_operation(
    config: RuntimeConfig, action: str, flow_id: str | None, timeout: float
) -> int:
    """Queue an operator command, wait for the node to carry it out, print the outcome."""
    database = node_database(config)
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

            database = node_database(config)
            try:
                if args.outbox_command == "drop":
                    return drop_peer_rows(config, database, args.peer)
                return print_outbox_rows(config, database, args.json, args.limit)
            finally:
                database.close()
        if args.command == "node" and args.node_command == "outbox":
            from flows.cli.peer import print_outbox

            database = node_database(config)
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
