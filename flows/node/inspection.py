"""What an operator reads of a node's database: its flows, its processes, a checkpoint.

The rows of ``fiberflow flow list`` (flows with a checkpoint, and finished ones), what each
process of the node last reported, the worker holding each partition, and a checkpoint as
plain JSON data (``checkpoints dump``). The node may be running or not: everything is read
from its tables, and the database is opened, never created. The command line
(:mod:`flows.cli.local`) and the HTTP API (:mod:`flows.rpc.gateway`) both read through here.
"""

from __future__ import annotations

import base64
import datetime
import json
import time
from typing import Any

import attrs
from sqlalchemy import func, select

from flows.config.runtime import RuntimeConfig
from flows.network.identity import load_or_create_identity
from foundation.serialization import PAYLOADS, SerializationError
from persistence import schema
from persistence.checkpoint_codec import decode_checkpoint
from persistence.lease_rows import database_clock, read_assignment, read_holders
from persistence.store import NodeDatabase
from statemachine.partitions import partition_of, partition_ranges


def node_database(config: RuntimeConfig, with_mac: bool = False) -> NodeDatabase:
    """The node's existing database (never created: a missing one raises, naming the URL).

    ``with_mac``: with the checkpoint MAC key from the node's key file, when it is there.
    """
    mac_key = None
    if with_mac and config.key_file is not None and config.key_file.exists():
        mac_key = load_or_create_identity(config.key_file, config.name).mac_key()
    return NodeDatabase(
        config.database_url, schema_name=config.database_schema, mac_key=mac_key, create=False
    )


def age_since(milliseconds: int) -> str:
    """The age of a moment in epoch milliseconds, as :func:`age_text` shows it."""
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
    database = node_database(config)
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
            f"running {age_since(busy[row.flow_id][0])} at {busy[row.flow_id][1]}"
            if row.flow_id in busy
            else _waiting_on(row.suspended_on, row.waiting_for)
        ),
        "age": age_since(row.created_at),
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
    database = node_database(config)
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
        "age": age_since(ended_at),
        "step": "-",
        "error": error,
        "error_class": error_class,
        "traceback": traceback,
    }


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


def process_reports(config: RuntimeConfig) -> list[str]:
    """One line per live process of the node: who it is and what it last said of its flows.

    From the processes' rows in ``node_workers``: a process's report rides on its lease
    renewals (every second for a worker of a node run by several workers, every third of the
    lease otherwise).
    """
    database = node_database(config)
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
        f"({age_since(int(counts['at'] * 1000))} ago): "
        f"{counts['in_memory'] + counts['dormant']} live, {counts['in_memory']} in memory"
        f"{f' (waiting: {waiting})' if waiting else ''}, {counts['dormant']} hibernated or not "
        f"restored since its start, {counts['restoring']} being restored"
    )


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
    database = node_database(config, with_mac=True)
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
