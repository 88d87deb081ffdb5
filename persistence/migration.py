"""Schema versions of the node database and the migrations between them (Alembic).

Alembic is the migration tool of SQLAlchemy, maintained with it: it keeps the revision a
database is at in a table of its own (``alembic_version``, in the node's schema on
PostgreSQL), orders the migration scripts and runs them in one transaction. The scripts live
in the package (:mod:`persistence.migrations`); Alembic is configured here, in code.

Revision ids are the schema versions written with four digits (``0008`` is version 8), and
every migration also keeps ``node_schema_version`` up to date, which is what a database made
before fiberflow used Alembic has: ``node_schema_version`` = 7 and no ``alembic_version``
table is revision ``0007``, the baseline.

* :func:`stored_revision` reads the revision a database is at;
* :func:`check_revision` refuses one that is not this fiberflow's (:class:`SchemaVersionError`,
  naming the command that upgrades it, or both versions if the database is newer);
* :func:`stamp_head` marks a database just created from the current tables as current;
* :func:`upgrade_database` / :func:`downgrade_database` run the migrations.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, make_url, select, text

from foundation.engine import write_engine
from persistence import schema

MIGRATIONS = Path(__file__).parent / "migrations"
"""The Alembic environment (``env.py``) and its scripts (``versions/``)."""

UPGRADE_COMMAND = "fiberflow db upgrade --config node.toml"
"""What an operator runs to bring a node database up to this fiberflow's version."""


class SchemaVersionError(RuntimeError):
    """The database was made by another schema version of fiberflow."""


class NodeDatabaseMissingError(RuntimeError):
    """There is no node database where one was to be opened (and it was not to be created)."""


@attrs.frozen
class MigrationStep:
    """One migration that ran: from one schema version to the next (or back)."""

    from_version: int | None
    """None: an empty database."""
    to_version: int | None
    """None: an empty database (the baseline undone)."""


def safe_url(url: str) -> str:
    """``url`` with its password (if any) hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy can parse: shown as it was given
        return url


def where(url: str, schema_name: str | None) -> str:
    """``url``, and the schema on PostgreSQL, as messages name a node database."""
    shown = safe_url(url)
    return shown if schema_name is None else f"{shown} (schema {schema_name})"


@functools.cache
def scripts() -> ScriptDirectory:
    """The migration scripts shipped with this fiberflow."""
    return ScriptDirectory(str(MIGRATIONS))


def head_revision() -> str:
    """The newest revision this fiberflow knows (its :data:`schema.SCHEMA_VERSION`)."""
    head = scripts().get_current_head()
    assert head is not None, "no migration scripts"
    return head


def revision_of(version: int) -> str:
    """The revision id of schema version ``version`` (``8`` -> ``"0008"``)."""
    return f"{version:04d}"


def version_of(revision: str) -> int | None:
    """The schema version of a revision id (None: not one of fiberflow's)."""
    return int(revision) if revision.isdigit() else None


def _known(revision: str) -> bool:
    return any(script.revision == revision for script in scripts().walk_revisions())


def _version_text(revision: str) -> str:
    version = version_of(revision)
    return str(version) if version is not None else f"revision {revision!r}"


def node_tables(connection: Connection, schema_name: str | None) -> set[str]:
    """The names of the tables in the node's schema (``schema_name``; None: the default)."""
    return set(inspect(connection).get_table_names(schema=schema_name))


def stored_revision(connection: Connection, schema_name: str | None) -> str | None:
    """The revision the database is at; None if it holds no node tables.

    From ``alembic_version``; for a database made before fiberflow used Alembic, from
    ``node_schema_version`` (version 7 is revision ``0007``).
    """
    tables = node_tables(connection, schema_name)
    if "alembic_version" in tables:
        context = MigrationContext.configure(connection, opts={"version_table_schema": schema_name})
        return context.get_current_revision()
    if "node_schema_version" not in tables:
        return None
    versions = sorted(connection.execute(select(schema.node_schema_version.c.version)).scalars())
    if len(versions) != 1:
        raise SchemaVersionError(
            f"node_schema_version holds {versions or 'no row'}, not one version"
        )
    return revision_of(versions[0])


def check_revision(revision: str, shown: str) -> None:
    """Raise :class:`SchemaVersionError` unless ``revision`` is this fiberflow's head.

    ``shown`` names the database in the message (see :func:`where`).
    """
    head = head_revision()
    if revision == head:
        return
    found, needed = _version_text(revision), _version_text(head)
    if _known(revision):
        raise SchemaVersionError(
            f"{shown} has schema version {found}, this fiberflow needs {needed}: stop the "
            f"node and run `{UPGRADE_COMMAND}` (with the node's config)"
        )
    found_version, head_version = version_of(revision), version_of(head)
    if found_version is not None and head_version is not None and found_version < head_version:
        raise SchemaVersionError(
            f"{shown} has schema version {found}, older than the first this fiberflow can "
            f"upgrade ({version_of(scripts().get_base() or head)}); it needs {needed}"
        )
    raise SchemaVersionError(
        f"{shown} has schema version {found}, newer than this fiberflow knows ({needed}): "
        "run a fiberflow that knows it"
    )


def stamp_head(connection: Connection, schema_name: str | None) -> None:
    """Record in ``alembic_version`` that the database is at the newest revision."""
    context = MigrationContext.configure(connection, opts={"version_table_schema": schema_name})
    context.stamp(scripts(), "head")


def upgrade_database(
    engine: Engine,
    schema_name: str | None,
    shown: str,
    check: Callable[[Connection], None] | None = None,
) -> list[MigrationStep]:
    """Upgrade the node database behind ``engine`` to the newest revision; the steps run.

    ``engine`` is a plain engine on the database (no schema translation); on PostgreSQL the
    node's tables are in ``schema_name``. Everything happens in one transaction: ``check``
    (given the connection first: it may raise to refuse), recognising a database made before
    Alembic (it is stamped ``0007``), every migration. Raises
    :class:`NodeDatabaseMissingError` if there are no node tables, :class:`SchemaVersionError`
    for a version this fiberflow cannot upgrade. Nothing to do: an empty list.
    """
    return _migrate(engine, schema_name, shown, check, "head", upgrade=True)


def downgrade_database(
    engine: Engine, schema_name: str | None, shown: str, version: int
) -> list[MigrationStep]:
    """Take the node database back to schema ``version`` (tests; undoing an upgrade).

    What a later version added is dropped (for version 7: the failures' tracebacks).
    """
    return _migrate(engine, schema_name, shown, None, revision_of(version), upgrade=False)


def _migrate(
    engine: Engine,
    schema_name: str | None,
    shown: str,
    check: Callable[[Connection], None] | None,
    target: str,
    *,
    upgrade: bool,
) -> list[MigrationStep]:
    steps: list[MigrationStep] = []

    def on_version_apply(step: Any, **_: Any) -> None:
        down = list(step.down_revision_ids)
        up = step.up_revision_id
        old, new = (
            (down[0] if down else None, up) if step.is_upgrade else (up, down[0] if down else None)
        )
        steps.append(
            MigrationStep(
                None if old is None else version_of(old), None if new is None else version_of(new)
            )
        )

    with write_engine(engine).begin() as connection:
        if connection.dialect.name == "postgresql" and schema_name is not None:
            quoted = connection.dialect.identifier_preparer.quote_schema(schema_name)
            connection.execute(text(f"SET LOCAL search_path TO {quoted}"))
        if check is not None:
            check(connection)
        revision = stored_revision(connection, schema_name)
        if revision is None:
            raise NodeDatabaseMissingError(f"no node database at {shown}: it has no node tables")
        if not _known(revision):
            check_revision(revision, shown)  # raises: not one this fiberflow can migrate
        if "alembic_version" not in node_tables(connection, schema_name):
            context = MigrationContext.configure(
                connection, opts={"version_table_schema": schema_name}
            )
            context.stamp(scripts(), revision)  # made before Alembic: at the baseline
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes.update(
            connection=connection, schema_name=schema_name, on_version_apply=on_version_apply
        )
        if upgrade:
            command.upgrade(config, target)
        else:
            command.downgrade(config, target)
    return steps
