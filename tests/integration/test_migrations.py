"""Schema migrations: a database with live flows made at schema 7 is refused, upgraded, resumed.

The schema-7 databases are made the way users have them: by real flows (committed
checkpoints, outbox rows not yet sent), then taken back to revision 0007 by the migrations
and stripped of ``alembic_version``, as a database made before fiberflow used Alembic is.
Also: the migrations give exactly the tables of :mod:`persistence.schema`; ``fiberflow db``
through the CLI (refused while a node holds the lease, idempotent); clients and operator
commands refuse a database that does not exist, naming the URL, and create nothing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text

from flows.cli.main import main
from flows.node.client import NodeClient
from flows.testing import MockNetwork, MockNode, SimulatedCrash
from foundation.engine import drop_schema, normalize_url, open_engine
from persistence import schema
from persistence.lease import NodeLease
from persistence.migration import (
    MigrationStep,
    NodeDatabaseMissingError,
    SchemaVersionError,
    downgrade_database,
    head_revision,
    upgrade_database,
)
from persistence.store import NodeDatabase
from samples.pingpong import PingFlow
from tests.conftest import POSTGRES_URL, database_for, postgres_problem, require_service
from tests.helpers import assert_drained
from tests.process.test_runtime import write_config


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> str:
    """``"sqlite"`` or the PostgreSQL URL (skipped, or failed in CI, without PostgreSQL)."""
    return database_for(str(request.param))


def plain_engine(node: MockNode) -> Engine:
    """An engine on the node's database without schema translation (what migrations use)."""
    return open_engine(node.config.database_url)


def make_pre_alembic(node: MockNode) -> None:
    """Take the node's database back to schema 7 as a fiberflow before Alembic left it."""
    engine = plain_engine(node)
    schema_name = node.config.database_schema
    try:
        steps = downgrade_database(engine, schema_name, "the node database", 7)
        assert steps == [MigrationStep(9, 8), MigrationStep(8, 7)]
        table = "alembic_version" if schema_name is None else f'"{schema_name}".alembic_version'
        with engine.begin() as connection:
            connection.execute(text(f"DROP TABLE {table}"))
            columns = inspect(connection).get_columns("node_flow_exceptions", schema=schema_name)
            assert "traceback" not in {c["name"] for c in columns}
            assert "session_facts" not in {c["name"] for c in columns}
            version = f"{'' if schema_name is None else schema_name + '.'}node_schema_version"
            assert connection.execute(text(f"SELECT version FROM {version}")).scalars().all() == [7]
    finally:
        engine.dispose()


def test_the_newest_migration_is_this_fiberflows_schema_version() -> None:
    assert head_revision() == f"{schema.SCHEMA_VERSION:04d}"


def test_the_migrations_give_the_tables_of_the_schema(tmp_path: Path, database: str) -> None:
    with MockNetwork(cordapps=["samples.pingpong"], directory=tmp_path, database=database) as net:
        alice = net.create_node("O=Alice,L=London,C=GB")
        alice.node.stop()
        make_pre_alembic(alice)
        engine = plain_engine(alice)
        schema_name = alice.config.database_schema
        try:
            steps = upgrade_database(engine, schema_name, "alice")
            assert steps == [MigrationStep(7, 8), MigrationStep(8, 9)]
        finally:
            engine.dispose()
        # Reflected as the node sees its tables: on PostgreSQL with its schema the default.
        options = {} if schema_name is None else {"options": f"-csearch_path={schema_name}"}
        engine = create_engine(normalize_url(alice.config.database_url), connect_args=options)
        try:
            with engine.connect() as connection:
                context = MigrationContext.configure(connection)
                differences = [
                    d
                    for d in compare_metadata(context, schema.metadata)
                    if not (d[0] == "remove_table" and d[1].name == "alembic_version")
                ]
            assert differences == []
        finally:
            engine.dispose()


def test_live_flows_at_schema_7_are_refused_then_upgraded_and_finish(
    tmp_path: Path, database: str
) -> None:
    with MockNetwork(cordapps=["samples.pingpong"], directory=tmp_path, database=database) as net:
        alice = net.create_node("O=Alice,L=London,C=GB")
        bob = net.create_node("O=Bob,L=New York,C=US")
        handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(3)]
        alice.crash_at("after_commit")  # the pings are committed, none handed to the network
        with pytest.raises(SimulatedCrash):
            alice.node.run_once()
        for node in (alice, bob):
            node.node.stop()
        opened = NodeDatabase(
            alice.config.database_url, schema_name=alice.config.database_schema, create=False
        )
        try:
            assert opened.count("node_checkpoints") == 3
            assert opened.count("node_outbox") == 3
        finally:
            opened.close()
        for node in (alice, bob):
            make_pre_alembic(node)

        with pytest.raises(SchemaVersionError, match="fiberflow db upgrade --config node.toml"):
            alice.restart()
        for node in (alice, bob):
            engine = plain_engine(node)
            try:
                steps = upgrade_database(engine, node.config.database_schema, node.name)
            finally:
                engine.dispose()
            assert steps == [MigrationStep(7, 8), MigrationStep(8, 9)]
            node.restart()
        net.run_network()
        assert [alice.flow_result(h.flow_id) for h in handles] == ["Pong"] * 3
        assert_drained(net)


@pytest.fixture
def alice_config(tmp_path: Path) -> Iterator[Path]:
    """A node config whose SQLite database holds a node at schema 7 (made before Alembic)."""
    with MockNetwork(directory=tmp_path / "net", database="sqlite") as net:
        alice = net.create_node("O=Alice,L=London,C=GB")
        alice.node.stop()
        make_pre_alembic(alice)
        yield write_config(
            tmp_path / "alice.toml",
            name=alice.name,
            database_url=alice.config.database_url,
            transport_url="sqlite:///queue.db",
            cordapps=["samples.pingpong"],
        )


def test_db_upgrade_through_the_cli(alice_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "current", "--config", str(alice_config)]) == 0
    assert "schema version 7; this fiberflow needs 9" in capsys.readouterr().out
    assert main(["flow", "list", "--config", str(alice_config)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "fiberflow db upgrade --config node.toml" in error

    from flows.config.runtime import load_config

    engine = open_engine(load_config(alice_config).database_url)
    lease = NodeLease(engine, lease_seconds=60)
    lease.acquire()  # this process runs the node, as far as the database can tell
    try:
        assert main(["db", "upgrade", "--config", str(alice_config)]) == 2
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0, error
        assert "the node is running" in error and f"pid {os.getpid()}" in error, error
    finally:
        lease.release()
        engine.dispose()
    assert main(["db", "current", "--config", str(alice_config)]) == 0
    assert "schema version 7;" in capsys.readouterr().out  # nothing was changed

    assert main(["db", "upgrade", "--config", str(alice_config)]) == 0
    steps = capsys.readouterr().out.strip().splitlines()[-2:]
    assert steps[0].endswith("schema version 7 -> 8") and steps[1].endswith("schema version 8 -> 9")
    assert main(["db", "upgrade", "--config", str(alice_config)]) == 0
    assert capsys.readouterr().out.strip().endswith("already at 9")
    assert main(["db", "current", "--config", str(alice_config)]) == 0
    assert "schema version 9 (current)" in capsys.readouterr().out
    assert main(["flow", "list", "--config", str(alice_config)]) == 0


@pytest.mark.parametrize("where", ["missing file", "typo'd directory"])
def test_operator_and_client_commands_refuse_a_missing_sqlite_database(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / ("alcie.db" if where == "missing file" else "nodse/alice.db")
    config = write_config(
        tmp_path / "alice.toml",
        name="O=Alice,L=London,C=GB",
        database_url=f"sqlite:///{path}",
        transport_url="sqlite:///queue.db",
        cordapps=["samples.pingpong"],
    )
    commands = [
        ["flow", "list"],
        ["checkpoints", "dump", "some-flow"],
        ["node", "outbox"],
        ["node", "drain", "--timeout", "0.1"],
        ["flow", "kill", "some-flow", "--timeout", "0.1"],
        ["schedule", "list"],
        ["db", "upgrade"],
        ["db", "current"],
    ]
    for command in commands:
        assert main([*command, "--config", str(config)]) == 2, command
        error = capsys.readouterr().err.strip()
        assert error.count("\n") == 0 and "Traceback" not in error, error
        assert f"no node database at sqlite:///{path}" in error, error
    with pytest.raises(NodeDatabaseMissingError, match=f"sqlite:///{path}"):
        NodeClient(f"sqlite:///{path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alice.toml"]  # nothing created


def test_a_client_refuses_an_empty_postgresql_schema() -> None:
    require_service("PostgreSQL", postgres_problem())
    schema_name = f"ff_empty_{uuid.uuid4().hex[:8]}"
    with pytest.raises(NodeDatabaseMissingError, match=f"schema {schema_name}.*no node tables"):
        NodeClient(POSTGRES_URL, database_schema=schema_name)
    engine = open_engine(POSTGRES_URL)
    try:
        with engine.connect() as connection:
            assert schema_name not in inspect(connection).get_schema_names()  # not created
        with engine.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema_name}"'))
        with pytest.raises(NodeDatabaseMissingError, match="no node tables"):
            NodeClient(POSTGRES_URL, database_schema=schema_name)
    finally:
        engine.dispose()
        drop_schema(POSTGRES_URL, schema_name)


def test_a_database_newer_than_this_fiberflow_is_refused_naming_both_versions(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'node.db'}"
    NodeDatabase(url).close()
    engine = open_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '0010'"))
    finally:
        engine.dispose()
    for create in (True, False):
        with pytest.raises(SchemaVersionError, match="version 10, newer than this fiberflow .*9"):
            NodeDatabase(url, create=create)
