"""The ``fiberflow`` command line."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flows.cli.analyze import add_analyze_arguments, run_analyze
from flows.cli.db import add_db_arguments, run_db_command
from flows.cli.demo import run_in_process_demo, run_process_demo
from flows.cli.flow import add_connection_arguments, add_flow_start_arguments, run_flow_command
from flows.cli.network import add_network_arguments, run_network_command
from flows.cli.schedule import add_schedule_arguments
from flows.node.inspection import FAILED_SHOWN
from flows.process.command import run_node, startup_problem
from flows.process.logs import LOG_LEVELS, configure_logging
from messaging.transports import TransportUrlError, transport_scheme


def package_version() -> str:
    """The installed fiberflow's version (its package metadata)."""
    try:
        return importlib.metadata.version("fiberflow")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (fiberflow is not installed: pip install -e .)"


def log_level(text: str) -> str:
    """``--log-level``'s value, upper-cased; a level logging does not know is refused."""
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level (use one of {', '.join(LOG_LEVELS)})"
        )
    return level


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fiberflow`` console script."""
    parser = argparse.ArgumentParser(prog="fiberflow", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fiberflow {package_version()}")
    parser.add_argument(
        "--log-level",
        type=log_level,
        help="logging level of every command: DEBUG, INFO, WARNING, ERROR or CRITICAL (default "
        "WARNING; a node process's default is its config's log_level)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run ping/pong between two nodes")
    demo.add_argument("--flows", type=int, default=10, help="how many ping/pong flows (10)")
    demo.add_argument("--directory", type=Path, help="keep configs, logs and databases here")
    demo.add_argument(
        "--transport", help="transport URL (default: a SQLite SQL queue in the directory)"
    )
    demo.add_argument(
        "--database", help="postgresql:// URL for both nodes (a schema each; default SQLite)"
    )
    demo.add_argument("--timeout", type=float, help="seconds to wait for the flows")
    demo.add_argument(
        "--in-process", action="store_true", help="both nodes in this process, in memory network"
    )
    demo.add_argument("--verbose", action="store_true", help="(in-process) print checkpoints")
    demo.add_argument(
        "--topology",
        choices=("shared", "p2p"),
        default="shared",
        help="shared: one transport for both nodes (default); p2p: each node its own inbound, "
        "bridges between them, a network trust root (docs/network.md)",
    )
    node = commands.add_parser("node", help="run a node")
    node_commands = node.add_subparsers(dest="node_command", required=True)
    node_run = node_commands.add_parser("run", help="run a node process until SIGTERM")
    node_run.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    node_run.add_argument(
        "--worker",
        metavar="NAME",
        help="run as the worker NAME of a node run by several worker processes (node database "
        "on PostgreSQL; SQL queue or RabbitMQ transport): each runs a fair share of the node's "
        "flows and takes over a dead worker's (docs/scaling.md)",
    )
    for action, text in (("drain", "refuse new flows"), ("undrain", "accept new flows again")):
        sub = node_commands.add_parser(action, help=f"tell a running node to {text}")
        add_connection_arguments(sub)
        sub.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (30)")
    outbox = node_commands.add_parser(
        "outbox", help="messages waiting for each peer, and what the network map says of it"
    )
    outbox.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    add_outbox_arguments(commands)
    flow = commands.add_parser(
        "flow",
        help="start a flow, list flows, or kill/pause/resume/retry one (--config or --url)",
    )
    flow_commands = flow.add_subparsers(dest="flow_command", required=True)
    add_flow_start_arguments(flow_commands)
    flow_list = flow_commands.add_parser(
        "list",
        help="the node's flows with a checkpoint, and the failed flows with their errors",
        description="The node's flows with a checkpoint (running, waiting, paused, in the "
        f"hospital), then the {FAILED_SHOWN} most recent failed flows with their error class "
        "and message; --all lists every failed flow and the completed ones too.",
    )
    add_connection_arguments(flow_list)
    flow_list.add_argument(
        "--json", action="store_true", help="print the flows and reports as one JSON document"
    )
    flow_list.add_argument(
        "--all",
        action="store_true",
        help=f"every failed flow (not only the {FAILED_SHOWN} most recent) and the completed ones",
    )
    flow_error = flow_commands.add_parser(
        "error", help="a failed flow's error and the traceback its node kept"
    )
    flow_error.add_argument("flow_id")
    add_connection_arguments(flow_error)
    for action in ("kill", "pause", "resume", "retry"):
        sub = flow_commands.add_parser(action, help=f"{action} a flow on a running node")
        sub.add_argument("flow_id")
        add_connection_arguments(sub)
        sub.add_argument("--timeout", type=float, default=30.0, help="seconds to wait (30)")
    checkpoints = commands.add_parser("checkpoints", help="inspect stored checkpoints")
    checkpoint_commands = checkpoints.add_subparsers(dest="checkpoints_command", required=True)
    dump = checkpoint_commands.add_parser("dump", help="a checkpoint as readable JSON")
    dump.add_argument("flow_id")
    dump.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    amqp = commands.add_parser("amqp-setup", help="set up RabbitMQ for nodes with own users")
    amqp.add_argument("--admin-url", required=True, help="amqp:// URL of an administrator")
    amqp.add_argument(
        "--node", action="append", required=True, metavar="NAME=USER", help="a node and its user"
    )
    peer = commands.add_parser(
        "peer-account",
        help="p2p: give a peer an account on this node's own inbound (publish/insert only)",
    )
    peer.add_argument("--inbound", required=True, help="this node's inbound URL (an owner's)")
    peer.add_argument("--node", required=True, help="this node's name (its queue)")
    peer.add_argument("--user", required=True, help="the peer's account (user or role) name")
    peer.add_argument("--password", help="its password (default: a random one, printed)")
    peer.add_argument(
        "--apply", action="store_true", help="PostgreSQL: run the statements instead of printing"
    )
    network = commands.add_parser(
        "network",
        help="the network trust root: create it, request and issue node certificates, verify",
        description="The network trust root: create-root (operator, once), request (each "
        "node), issue (operator), then start each node with network_root and certificate in "
        "its config; verify checks a network map against the root.",
    )
    add_network_arguments(network)
    schedule = commands.add_parser(
        "schedule", help="start flows on a schedule: add, list, pause, resume, remove"
    )
    add_schedule_arguments(schedule)
    database = commands.add_parser(
        "db", help="the node database's schema version: upgrade it, or print it"
    )
    add_db_arguments(database)
    rpc = commands.add_parser(
        "rpc", help="the node's HTTP API: hash a user's password, make an API token (docs/rpc.md)"
    )
    rpc_commands = rpc.add_subparsers(dest="rpc_command", required=True)
    rpc_commands.add_parser(
        "hash-password",
        help="read a password (stdin, or a prompt) and print its argon2 hash for password_hash",
    )
    rpc_commands.add_parser(
        "new-token", help="print a new random API token and its argon2 hash for token_hash"
    )
    analyze = commands.add_parser("analyze", help="Spark analytics of node databases (report)")
    add_analyze_arguments(analyze)
    args = parser.parse_args(argv)
    if not (args.command == "node" and args.node_command == "run"):
        configure_logging(args.log_level or "WARNING")
    if args.command == "analyze":
        return run_analyze(args)
    if args.command == "network":
        return run_network_command(args)
    if args.command == "db":
        return run_db_command(args)
    if args.command == "rpc":
        return run_rpc(args.rpc_command)
    if args.command == "schedule":
        from flows.cli.schedule import run_schedule_command

        return run_schedule_command(args)
    if args.command == "peer-account":
        from flows.cli.peer import run_peer_account

        return run_peer_account(args.inbound, args.node, args.user, args.password, args.apply)
    if args.command == "amqp-setup":
        return failing_in_one_line("amqp-setup", run_amqp_setup, args.admin_url, args.node)
    if args.command == "node" and args.node_command == "run":
        return run_node(args.config, worker=args.worker, log_level=args.log_level)
    if args.command == "flow" or (
        args.command == "node" and args.node_command in ("drain", "undrain")
    ):
        name = f"{args.command} {getattr(args, f'{args.command}_command')}"
        return failing_in_one_line(name, run_flow_command, args)
    if args.command in ("node", "flow", "checkpoints", "outbox"):
        from flows.cli.local import run_operator_command

        name = f"{args.command} {getattr(args, f'{args.command}_command')}"
        return failing_in_one_line(name, run_operator_command, args)
    if args.command == "demo":
        if args.flows < 1:
            parser.error("--flows must be at least 1")
        if args.timeout is not None and not args.timeout > 0:
            parser.error(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
        if args.database is not None and not args.database.startswith(("postgresql", "postgres")):
            parser.error(
                f"--database takes a postgresql:// URL (both nodes get a schema of their own in "
                f"it), not {args.database!r}; without it the demo uses SQLite files in its "
                "directory"
            )
        if args.transport is not None:
            try:
                transport_scheme(args.transport)
            except TransportUrlError as error:
                parser.error(f"--transport: {error}")
        if args.in_process:
            if args.transport or args.database or args.topology != "shared":
                parser.error("--in-process uses the in-memory network and SQLite files")
            return run_in_process_demo(args.flows, args.directory, args.verbose)
        if args.topology == "p2p" and args.transport:
            parser.error(
                "--topology p2p gives each node an inbound of its own (a SQL queue file); "
                "see docs/network.md to put inbounds on RabbitMQ or PostgreSQL"
            )
        return run_process_demo(
            args.flows, args.directory, args.transport, args.database, args.timeout, args.topology
        )
    parser.error(f"unknown command {args.command}")
    return 2


def failing_in_one_line(command: str, run: Callable[..., int], *args: Any) -> int:
    """``run(*args)``; an error escaping it is one line on stderr and exit status 2.

    The line names the command, the error's class and its first line; the traceback is
    logged at DEBUG (``fiberflow --log-level DEBUG ...`` shows it).
    """
    try:
        return run(*args)
    except Exception as error:
        logging.getLogger("fiberflow.cli").debug("fiberflow %s failed", command, exc_info=True)
        print(f"fiberflow {command}: {startup_problem(error)}", file=sys.stderr)
        return 2


def run_rpc(command: str) -> int:
    """``fiberflow rpc hash-password|new-token`` (needs the ``rpc`` extra)."""
    try:
        from flows.rpc.hashing import run_rpc_command
    except ImportError as error:
        print(
            f"fiberflow rpc {command}: needs fiberflow's rpc extra (pip install "
            f"'fiberflow[rpc]'): {error}",
            file=sys.stderr,
        )
        return 2
    return run_rpc_command(command)


def add_outbox_arguments(commands: Any) -> None:
    """``fiberflow outbox list|drop`` (:mod:`flows.cli.outbox`)."""
    outbox = commands.add_parser(
        "outbox", help="messages not yet taken by their peer; drop those of a party that left"
    )
    outbox_commands = outbox.add_subparsers(dest="outbox_command", required=True)
    listing = outbox_commands.add_parser(
        "list", help="every waiting message: peer, age, sending flow, what the map says"
    )
    listing.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    listing.add_argument("--json", action="store_true", help="every row, as one JSON document")
    listing.add_argument("--limit", type=int, default=50, help="rows printed one by one (50)")
    drop = outbox_commands.add_parser(
        "drop", help="delete the messages for a party that is not on the network map"
    )
    drop.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    drop.add_argument("--peer", required=True, help="the party's name, as `outbox list` shows")


def run_amqp_setup(admin_url: str, nodes: list[str]) -> int:
    """Create the exchanges, queues and bindings; print each node user's rabbitmqctl commands."""
    from messaging.amqp import node_url, permission_commands, setup_topology, url_vhost

    pairs = []
    for item in nodes:
        name, separator, user = item.rpartition("=")
        if not separator or not name or not user:
            print(f"fiberflow amqp-setup: --node {item!r} must be NAME=USER", file=sys.stderr)
            return 2
        pairs.append((name, user))
    setup_topology(admin_url, [name for name, _ in pairs])
    vhost = url_vhost(admin_url)
    print(f"# topology created on vhost {vhost!r}; now give each node its own broker user:")
    for name, user in pairs:
        print(f"# {name}")
        for command in permission_commands(name, user, "<password>", vhost):
            print(command)
    print(f"# then use {node_url(admin_url, 'USER', 'PASSWORD')} as each transport_url")
    return 0
