"""``fiberflow flow start`` and the ``--url`` side of the other flow and node commands.

Each of ``flow start|list|error|kill|pause|resume|retry`` and ``node drain|undrain`` reaches
the node in exactly one of two ways:

* ``--config node.toml``: through the node's database, as :class:`flows.node.client.NodeClient`
  and :mod:`flows.node.inspection` do (needs the database's rights; for local use);
* ``--url URL``: through the node's HTTP API (:class:`flows.rpc.client.RpcClient`) as one
  of its ``[rpc]`` users: ``--user`` (password from ``FIBERFLOW_PASSWORD`` or a prompt) or
  ``--token`` (or ``FIBERFLOW_TOKEN``); ``--ca-file`` for HTTPS with a private root.

Either way ``flow start`` starts only ``@startable_by_rpc`` flows of the node's CorDapps.
Exit statuses: 0 done; 1 the flow failed (``--wait``), or the node refused an operation or
has no such flow; 2 bad input or a refused start; 3 not done in time.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.cli.local import print_failure, render_flow_list, run_operator_command
from flows.node.inspection import FAILED_SHOWN, age_text, node_database

PASSWORD_VARIABLE = "FIBERFLOW_PASSWORD"
TOKEN_VARIABLE = "FIBERFLOW_TOKEN"
LOCAL_USER = "local"
"""The user a ``--config`` start counts as (its ``--request-id`` makes the flow id)."""


class CommandInputError(ValueError):
    """Bad input to a command: printed as one line, exit status 2."""


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` or ``--url`` (with ``--user``/``--token``/``--ca-file``)."""
    parser.add_argument("--config", type=Path, help="the node's TOML config (its database)")
    parser.add_argument(
        "--url", help="the node's HTTP API instead of --config, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument(
        "--user", help=f"--url: log in as this user (password from ${PASSWORD_VARIABLE} or asked)"
    )
    parser.add_argument("--token", help=f"--url: log in with this API token (or ${TOKEN_VARIABLE})")
    parser.add_argument(
        "--ca-file", type=Path, help="--url: trust this CA certificate (PEM) for https://"
    )


def add_flow_start_arguments(flow_commands: Any) -> None:
    """``fiberflow flow start CLASS --arg name=value ... [--wait]``."""
    start = flow_commands.add_parser(
        "start",
        help="start a @startable_by_rpc flow by class name, through --url or --config",
        description="Start a @startable_by_rpc flow of the node by its qualified class name. "
        "Each --arg name=value is a constructor argument: the value is read as JSON if it "
        'parses (42, 1.5, true, ["a","b"], "text") and as plain text otherwise; a Party '
        "argument takes the party's X.500 name. Prints the flow id; with --wait, each "
        "progress step as it happens and then the result (exit 1 if the flow failed).",
    )
    start.add_argument("flow_class", metavar="CLASS", help="e.g. samples.pingpong.flows.PingFlow")
    start.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a constructor argument (repeat for each)",
    )
    start.add_argument("--wait", action="store_true", help="follow the flow until it ends")
    start.add_argument(
        "--timeout", type=float, default=300.0, help="seconds --wait waits (300; exit 3 after)"
    )
    start.add_argument(
        "--request-id",
        help="a client request id: starting again with the same id starts nothing new",
    )
    add_connection_arguments(start)


def parse_flow_arguments(items: list[str]) -> dict[str, Any]:
    """``name=value`` items as constructor arguments (value: JSON if it parses, else text)."""
    arguments: dict[str, Any] = {}
    for item in items:
        name, separator, text = item.partition("=")
        name = name.strip()
        if not separator:
            raise CommandInputError(f"--arg {item!r} must be NAME=VALUE")
        if not name.isidentifier():
            raise CommandInputError(f"--arg {item!r}: {name!r} is not an argument name")
        if name in arguments:
            raise CommandInputError(f"--arg {name} is given twice")
        try:
            arguments[name] = json.loads(text)
        except ValueError:
            arguments[name] = text
    return arguments


def connection_problem(args: argparse.Namespace) -> str | None:
    """Why the ``--config``/``--url`` options cannot be used, or None."""
    if (args.config is None) == (args.url is None):
        return (
            "give --config node.toml (through the node's database) or --url URL (through "
            "its HTTP API)" + (", not both" if args.config is not None else "")
        )
    if args.config is not None:
        given = [name for name in ("user", "token", "ca_file") if getattr(args, name)]
        if given:
            return f"--{given[0].replace('_', '-')} goes with --url, not --config"
    elif args.user is not None and args.token is not None:
        return "give --user or --token, not both"
    return None


def run_flow_command(args: argparse.Namespace) -> int:
    """``fiberflow flow ...`` and ``node drain|undrain``: through the database or the API."""
    name = f"{args.command} {getattr(args, f'{args.command}_command')}"
    problem = connection_problem(args)
    if problem is not None:
        print(f"fiberflow {name}: {problem}", file=sys.stderr)
        return 2
    try:
        if args.command == "flow" and args.flow_command == "start":
            arguments = parse_flow_arguments(args.arg)
            if args.timeout is not None and not args.timeout > 0:
                raise CommandInputError("--timeout must be a positive number of seconds")
            if args.url is None:
                return start_locally(args, arguments)
            return start_over_http(args, arguments)
        if args.url is None:
            return run_operator_command(args)
        return run_over_http(args)
    except CommandInputError as error:
        print(f"fiberflow {name}: {error}", file=sys.stderr)
        return 2


# --- through the HTTP API ---------------------------------------------------------------------


def rpc_client(args: argparse.Namespace, timeout: float = 60.0) -> Any:
    """The :class:`~flows.rpc.client.RpcClient` of ``--url`` and its credentials."""
    try:
        from flows.rpc.client import RpcClient
    except ImportError as error:
        raise CommandInputError(
            f"--url needs httpx (pip install 'fiberflow[client]'): {error}"
        ) from None
    token = args.token if args.user is None else None
    if args.user is None and token is None:
        token = os.environ.get(TOKEN_VARIABLE) or None
    password = None
    if args.user is not None:
        password = os.environ.get(PASSWORD_VARIABLE)
        if not password:
            if not sys.stdin.isatty():
                raise CommandInputError(
                    f"no password for user {args.user}: set {PASSWORD_VARIABLE} or run on a "
                    "terminal to be asked"
                )
            password = getpass.getpass(f"password of {args.user}: ")
    elif token is None:
        raise CommandInputError(
            f"--url needs --user (password from {PASSWORD_VARIABLE} or a prompt) or --token "
            f"(or {TOKEN_VARIABLE})"
        )
    try:
        return RpcClient(
            args.url,
            user=args.user,
            password=password,
            token=token,
            verify=args.ca_file if args.ca_file is not None else True,
            timeout=timeout,
        )
    except ValueError as error:
        raise CommandInputError(str(error)) from None


def start_over_http(args: argparse.Namespace, arguments: dict[str, Any]) -> int:
    """``flow start --url``: start through the API; with ``--wait`` follow its event stream."""
    from flows.rpc.client_errors import RpcError

    name = "fiberflow flow start"
    with rpc_client(args) as client:
        try:
            started = client.start(args.flow_class, client_request_id=args.request_id, **arguments)
        except RpcError as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 2
        _print_started(started.flow_id, started.repeated, args.request_id)
        if not args.wait:
            return 0
        try:
            return follow(client.progress(started.flow_id, timeout=args.timeout), args.timeout)
        except RpcError as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 2


def run_over_http(args: argparse.Namespace) -> int:
    """``flow list|error|kill|pause|resume|retry`` and ``node drain|undrain`` with ``--url``."""
    from flows.rpc.client_errors import (
        RpcConflictError,
        RpcError,
        RpcNotFoundError,
        RpcTimeoutError,
    )

    operation = args.node_command if args.command == "node" else args.flow_command
    timeout = getattr(args, "timeout", 30.0)
    with rpc_client(args, timeout=timeout + 10) as client:
        try:
            if operation == "list":
                return list_over_http(client, args.json, args.all)
            if operation == "error":
                return error_over_http(client, args.flow_id)
            flow_id = getattr(args, "flow_id", None)
            perform = getattr(client, operation)
            print(perform(flow_id) if flow_id is not None else perform())
            return 0
        except (RpcNotFoundError, RpcConflictError) as refused:
            print(f"fiberflow: {refused}", file=sys.stderr)
            return 1
        except RpcTimeoutError as late:
            print(f"fiberflow: {late}", file=sys.stderr)
            return 3
        except RpcError as error:
            print(f"fiberflow {args.command} {operation}: {error}", file=sys.stderr)
            return 2


def list_over_http(client: Any, as_json: bool, everything: bool) -> int:
    """``flow list --url``: the same table (or JSON) as through the database."""
    info = client.node_info()
    live = [api_row(flow) for flow in client.list()]
    statuses = ["FAILED", "COMPLETED"] if everything else ["FAILED"]
    finished = [api_row(flow) for flow in client.list(finished=True, status=statuses)]
    finished.sort(key=lambda row: (row["status"] != "FAILED", row.pop("_age_seconds")))
    for row in live:
        row.pop("_age_seconds")
    hidden = 0
    failed = [row for row in finished if row["status"] == "FAILED"]
    if not everything and len(failed) > FAILED_SHOWN:
        hidden = len(failed) - FAILED_SHOWN
        finished = failed[:FAILED_SHOWN]
    process = info.get("process") or {}
    reports = [
        f"the process serving {client.url} (pid {process.get('pid')}, "
        f"{'holds' if process.get('lease_held') else 'does not hold'} the lease) reported "
        f"{info['flows']['live']} live flow(s)"
    ]
    return render_flow_list(
        live, finished, hidden, info["name"], reports, as_json, f"--url {client.url}"
    )


def api_row(flow: dict[str, Any]) -> dict[str, Any]:
    """An item of ``GET /api/flows`` as a row of ``flow list`` (see flows.node.inspection)."""
    error = flow.get("error")
    finished = flow["status"] in ("COMPLETED", "FAILED")
    exception_class = None
    if finished and error:
        exception_class, _, message = error.partition(": ")
        error = f"{exception_class.rsplit('.', 1)[-1]}: {message}"
    row: dict[str, Any] = {
        **({"worker": flow["worker"]} if "worker" in flow else {}),
        "flow_id": flow["flow_id"],
        "class": flow["class"].rsplit(".", 1)[-1],
        "status": flow["status"],
        "waiting_on": flow.get("waiting_on") or "-",
        "age": age_text(float(flow.get("age_seconds") or 0.0)),
        "step": flow.get("progress_step") or "-",
        "error": error,
        "_age_seconds": float(flow.get("age_seconds") or 0.0),
    }
    if finished:
        row["error_class"] = exception_class
        row["traceback"] = None  # the list does not carry it: flow error ID --url does
    return row


def error_over_http(client: Any, flow_id: str) -> int:
    """``flow error ID --url``: the failed flow's error and traceback, as the database's."""
    from flows.rpc.client_errors import RpcNotFoundError

    try:
        document = client.status(flow_id)
    except RpcNotFoundError:
        document = None
    outcome = (document or {}).get("outcome") or {}
    failure = outcome.get("error")
    if document is None or document["status"] != "FAILED" or failure is None:
        node = client.node_info()["name"]
        print(f"fiberflow: no failed flow {flow_id} on {node}", file=sys.stderr)
        return 1
    print_failure(
        flow_id,
        document["class"],
        _age_since(document.get("ended_at")),
        failure.get("class") or "",
        failure.get("message") or "",
        failure.get("traceback"),
    )
    return 0


def _age_since(iso: str | None) -> str:
    if not iso:
        return "?"
    moment = datetime.datetime.fromisoformat(iso)
    return age_text(time.time() - moment.timestamp())


# --- through the node's database ---------------------------------------------------------------


def start_locally(args: argparse.Namespace, arguments: dict[str, Any]) -> int:
    """``flow start --config``: the checks the API makes, then a request row in the database."""
    from flows.config.rpc import RpcUser
    from flows.config.runtime import ConfigError, load_config
    from flows.cordapps import Cordapps
    from flows.rpc.arguments import ArgumentError
    from flows.rpc.gateway import ApiError, NodeGateway

    name = "fiberflow flow start"
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"fiberflow: {error}", file=sys.stderr)
        return 2
    database = node_database(config)
    try:
        gateway = NodeGateway(database, config.name, Cordapps(config.cordapps))
        try:
            started = gateway.start(
                RpcUser(LOCAL_USER, start=("*",)), args.flow_class, arguments, args.request_id
            )
        except (ApiError, ArgumentError) as error:
            print(f"{name}: {getattr(error, 'message', error)}", file=sys.stderr)
            return 2
        flow_id = started.document["flow_id"]
        _print_started(flow_id, not started.created, args.request_id)
        if not args.wait:
            return 0
        return follow(polled_events(gateway, flow_id, args.timeout), args.timeout)
    finally:
        database.close()


def polled_events(gateway: Any, flow_id: str, timeout: float) -> Iterator[Any]:
    """The flow's events read from the node's database every 0.1 s, as the API streams them.

    Raises :class:`~flows.node.client.FlowWaitTimeoutError` after ``timeout`` seconds.
    """
    from flows.node.client import FlowWaitTimeoutError
    from flows.rpc.client_values import FlowEvent, FlowOutcome
    from flows.rpc.gateway import ApiError

    deadline = time.monotonic() + timeout
    last: tuple[str | None, str | None] | None = None
    while True:
        try:
            status, step, outcome = gateway.progress(flow_id)
        except ApiError as gone:
            yield FlowEvent("gone", flow_id, message=gone.message)
            return
        if outcome is not None:
            yield FlowEvent(
                "outcome", flow_id, status, None, FlowOutcome.from_json(flow_id, status, outcome)
            )
            return
        if (status, step) != last:
            last = (status, step)
            yield FlowEvent("status", flow_id, status, step)
        if time.monotonic() > deadline:
            raise FlowWaitTimeoutError(f"flow {flow_id} had not finished after {timeout:g} s")
        time.sleep(0.1)


# --- shared -------------------------------------------------------------------------------------


def _print_started(flow_id: str, repeated: bool, request_id: str | None) -> None:
    print(flow_id, flush=True)
    if repeated:
        print(
            f"fiberflow flow start: request id {request_id!r} was used before: that flow was "
            "started then, nothing new now",
            file=sys.stderr,
        )


def follow(events: Iterator[Any], timeout: float) -> int:
    """Print each progress step as it comes, then the result; the exit status.

    0: the flow completed (its result printed as JSON); 1: it failed (its error line on
    stderr) or ended without an outcome kept; 3: not within ``timeout`` seconds.
    """
    from flows.node.client import FlowWaitTimeoutError

    step = None
    try:
        for event in events:
            if event.kind == "status":
                if event.progress_step is not None and event.progress_step != step:
                    print(f"step: {event.progress_step}", flush=True)
                step = event.progress_step
            elif event.kind == "outcome":
                outcome = event.outcome
                if outcome.failed:
                    print(f"flow {event.flow_id} failed: {outcome.error_line()}", file=sys.stderr)
                    return 1
                print(json.dumps(outcome.result))
                return 0
            else:
                print(f"flow {event.flow_id}: {event.message}", file=sys.stderr)
                return 1
    except FlowWaitTimeoutError as late:
        print(
            f"fiberflow flow start: {late}; it goes on (see fiberflow flow list)", file=sys.stderr
        )
        return 3
    print("fiberflow flow start: the progress stream ended before the outcome", file=sys.stderr)
    return 1
