"""``fiberflow schedule``: add, list, pause, resume and remove a node's scheduled flows.

The commands write to the node's database (the node need not be running: it fires what is
due when it runs). A flow's arguments are given as JSON: ``--args`` a list, ``--kwargs`` an
object; ``{"party": "O=Bob,L=New York,C=US"}`` stands for a ``Party``. For example::

    fiberflow schedule add --config alice.toml --flow samples.pingpong.PingFlow
        --args '[{"party": "O=Bob,L=New York,C=US"}]' --every 60 --id ping-bob
    fiberflow schedule add --config alice.toml --flow app.ReportFlow --cron "0 6 * * *"
    fiberflow schedule list --config alice.toml
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from flows.config.runtime import ConfigError, load_config
from flows.flow_logic import FlowLogic
from flows.node.client import NodeClient
from flows.node.schedules import MISSED_POLICIES, ScheduleError, listing
from flows.party import Party
from persistence.migration import NodeDatabaseMissingError, SchemaVersionError
from persistence.schedule_store import ScheduleExistsError


def add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``schedule`` command's subcommands and options."""
    commands = parser.add_subparsers(dest="schedule_command", required=True)
    add = commands.add_parser("add", help="start a flow on a schedule")
    add.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    add.add_argument("--flow", required=True, help="the flow class, e.g. samples.pingpong.PingFlow")
    add.add_argument("--args", default="[]", help="positional arguments as a JSON list")
    add.add_argument("--kwargs", default="{}", help="keyword arguments as a JSON object")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--at", help="once, at this ISO time (with a timezone, e.g. ...Z)")
    when.add_argument("--every", type=float, help="every so many seconds")
    when.add_argument("--cron", help='a cron expression of five fields, UTC ("0 6 * * *")')
    add.add_argument("--id", dest="schedule_id", help="the schedule's name (default: made up)")
    add.add_argument(
        "--missed", choices=MISSED_POLICIES, default="skip", help="slots a node missed (skip)"
    )
    listed = commands.add_parser("list", help="the node's schedules")
    listed.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    for action in ("pause", "resume", "remove"):
        sub = commands.add_parser(action, help=f"{action} a schedule")
        sub.add_argument("schedule_id")
        sub.add_argument("--config", type=Path, required=True, help="the node's TOML config")


def run_schedule_command(args: argparse.Namespace) -> int:
    """Carry out a ``fiberflow schedule`` command; 0 on success, 2 with a message if not."""
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"fiberflow schedule: {error}", file=sys.stderr)
        return 2
    try:
        client = NodeClient(config.database_url, database_schema=config.database_schema)
    except (NodeDatabaseMissingError, SchemaVersionError) as error:
        print(f"fiberflow schedule: {error}", file=sys.stderr)
        return 2
    try:
        if args.schedule_command == "add":
            flow = _flow(args.flow, args.args, args.kwargs)
            schedule_id = client.schedule_flow(
                flow,
                at=None if args.at is None else _time(args.at),
                every=args.every,
                cron=args.cron,
                schedule_id=args.schedule_id,
                missed=args.missed,
            )
            (row,) = [r for r in listing(client.schedules()) if r["schedule_id"] == schedule_id]
            print(f"schedule {schedule_id}: {row['flow']} {row['when']}, next {row['next']}")
        elif args.schedule_command == "list":
            _print_table(listing(client.schedules()))
        elif args.schedule_command == "pause":
            client.pause_schedule(args.schedule_id)
        elif args.schedule_command == "resume":
            client.resume_schedule(args.schedule_id)
        else:
            client.remove_schedule(args.schedule_id)
    except (ScheduleError, ScheduleExistsError, ValueError, TypeError) as error:
        print(f"fiberflow schedule: {error}", file=sys.stderr)
        return 2
    except KeyError as error:
        print(f"fiberflow schedule: {error.args[0]}", file=sys.stderr)
        return 2
    finally:
        client.close()
    return 0


def _flow(name: str, args_json: str, kwargs_json: str) -> FlowLogic[Any]:
    module_name, _, class_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except ImportError as error:
        raise ValueError(f"--flow {name}: cannot import {module_name}: {error}") from None
    if not (isinstance(cls, type) and issubclass(cls, FlowLogic)):
        raise ValueError(f"--flow {name} is not a flow class (module.Class)")
    try:
        args, kwargs = json.loads(args_json), json.loads(kwargs_json)
    except json.JSONDecodeError as error:
        raise ValueError(f"--args and --kwargs must be JSON: {error}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("--args must be a JSON list and --kwargs a JSON object")
    try:
        flow: FlowLogic[Any] = cls(*map(_value, args), **{k: _value(v) for k, v in kwargs.items()})
    except TypeError as error:
        raise ValueError(f"{name} cannot be made with those arguments: {error}") from None
    return flow


def _value(value: Any) -> Any:
    """A JSON value as a flow argument: ``{"party": name}`` is a Party."""
    if isinstance(value, dict):
        if set(value) == {"party"}:
            return Party(value["party"])
        return {k: _value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value


def _time(text: str) -> datetime.datetime:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--at {text!r} is not an ISO time (2026-12-01T06:00:00Z)") from None
    if moment.tzinfo is None:
        raise ValueError(f"--at {text!r} needs a timezone (end it with Z for UTC)")
    return moment


def _print_table(rows: list[dict[str, Any]]) -> None:
    header = ("SCHEDULE", "FLOW", "WHEN", "NEXT", "STATE", "FIRED", "MISSED")
    keys = ("schedule_id", "flow", "when", "next", "state", "fired", "missed")
    table = [header, *[tuple(str(row[k]) for k in keys) for row in rows]]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    if not rows:
        print("(no schedules)")
