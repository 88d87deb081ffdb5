"""``fiberflow db upgrade`` and ``fiberflow db current``: the node database's schema version.

Both open the database the node's config names and never create one: a missing SQLite file
or a schema without the node tables is an error naming the URL. ``upgrade`` runs the
migrations (:mod:`persistence.migration`) up to this fiberflow's version, in one transaction,
and refuses while a node process holds the node's lease (upgrading under a running node
would change the tables beneath it). Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from flows.config.runtime import ConfigError, RuntimeConfig, load_config
from foundation.engine import open_engine
from persistence.lease_rows import live_holders
from persistence.migration import (
    NodeDatabaseMissingError,
    SchemaVersionError,
    head_revision,
    stored_revision,
    upgrade_database,
    version_of,
    where,
)
from persistence.store import require_sqlite_file


class NodeRunningError(RuntimeError):
    """A node process holds the node's lease: its database is not upgraded under it."""


def add_db_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``db`` sub-commands: ``upgrade`` and ``current``."""
    commands = parser.add_subparsers(dest="db_command", required=True)
    upgrade = commands.add_parser(
        "upgrade", help="upgrade the node's database to this fiberflow's schema version"
    )
    upgrade.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    current = commands.add_parser("current", help="print the node database's schema version")
    current.add_argument("--config", type=Path, required=True, help="the node's TOML config")


def run_db_command(args: argparse.Namespace) -> int:
    """Run ``fiberflow db upgrade|current``; returns the exit status."""
    prefix = f"fiberflow db {args.db_command}"
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"{prefix}: {error}", file=sys.stderr)
        return 2
    shown = where(config.database_url, config.database_schema)
    try:
        require_sqlite_file(config.database_url)
        engine = open_engine(config.database_url, synchronous=config.synchronous)
        try:
            if args.db_command == "current":
                print(current_text(engine, config, shown, args.config))
                return 0
            return upgrade(engine, config, shown)
        finally:
            engine.dispose()
    except (NodeDatabaseMissingError, SchemaVersionError, NodeRunningError) as error:
        print(f"{prefix}: {error}", file=sys.stderr)
        return 2
    except SQLAlchemyError as error:
        text = str(getattr(error, "orig", None) or error).strip()
        first = text.splitlines()[0] if text else type(error).__name__
        print(f"{prefix}: cannot use the database {shown}: {first}", file=sys.stderr)
        return 2


def current_text(engine: Engine, config: RuntimeConfig, shown: str, path: Path) -> str:
    """What ``db current`` prints: the version, and whether this fiberflow needs another."""
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql" and config.database_schema is not None:
            connection = connection.execution_options(
                schema_translate_map={None: config.database_schema}
            )
        revision = stored_revision(connection, config.database_schema)
    if revision is None:
        raise NodeDatabaseMissingError(f"no node database at {shown}: it has no node tables")
    found, head = version_of(revision), version_of(head_revision())
    if found == head:
        return f"{shown}: schema version {found} (current)"
    if found is not None and head is not None and found < head:
        return (
            f"{shown}: schema version {found}; this fiberflow needs {head} "
            f"(fiberflow db upgrade --config {path})"
        )
    return f"{shown}: schema version {found or revision}, newer than this fiberflow knows ({head})"


def upgrade(engine: Engine, config: RuntimeConfig, shown: str) -> int:
    """Upgrade the database to the newest version, printing each step; returns 0."""

    def refuse_while_running(connection: Connection) -> None:
        now, holders = live_holders(connection)
        if holders:
            raise NodeRunningError(
                f"the node is running ({holders[0].describe(now)}); stop it, then upgrade "
                "its database"
            )

    steps = upgrade_database(engine, config.database_schema, shown, refuse_while_running)
    if not steps:
        print(f"{shown}: already at {version_of(head_revision())}")
        return 0
    for step in steps:
        print(f"{shown}: schema version {step.from_version} -> {step.to_version}")
    return 0
