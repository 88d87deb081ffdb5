"""A peer's role on a node's SQL queue database (PostgreSQL) may insert into its inbound only.

Runs the statements ``peer_role_statements`` makes (what ``fiberflow sqlqueue-setup`` prints
for an operator) on a database of its own, then connects as the peer role.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from messaging.service import Message, TransportError
from tests.conftest import POSTGRES_URL, postgres_problem, require_service

CAROL = "O=Carol,L=Zurich,C=CH"
DAVE = "O=Dave,L=Oslo,C=NO"


@pytest.fixture
def queue_database() -> Iterator[tuple[str, str]]:
    """A fresh PostgreSQL database with Carol's and Dave's queues; (owner URL, peer URL)."""
    require_service("PostgreSQL", postgres_problem())
    from messaging.sqlqueue import SqlQueueBroker
    from messaging.sqlqueue.peer_roles import apply_statements, peer_role_statements

    tag = uuid.uuid4().hex[:8]
    name, role = f"ff_peer_test_{tag}", f"ff_peer_{tag}"
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    owner_url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    peer_url = (
        make_url(owner_url)
        .set(username=role, password="peer-pw")
        .render_as_string(hide_password=False)
    )
    try:
        owner = SqlQueueBroker(owner_url)
        owner.create_queue(CAROL)
        owner.create_queue(DAVE)
        owner.close()
        apply_statements(owner_url, peer_role_statements(role, "peer-pw", CAROL))
        yield owner_url, peer_url
    finally:
        with admin.connect() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            connection.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        admin.dispose()


def message(message_id: str) -> Message:
    return Message(message_id, "platform.session", "O=Alice,L=London,C=GB", b"hello")


def test_a_peer_role_inserts_into_the_nodes_inbound(queue_database: tuple[str, str]) -> None:
    from messaging.sqlqueue import SqlQueueBroker

    owner_url, peer_url = queue_database
    peer = SqlQueueBroker(peer_url)
    owner = SqlQueueBroker(owner_url)
    try:
        peer.enqueue([(message("m1"), CAROL)])  # one row: no RETURNING, which needs SELECT
        peer.enqueue([(message("m2"), CAROL), (message("m3"), CAROL)])
        assert owner.depth(CAROL) == 3
        assert owner.depth(DAVE) == 0
    finally:
        peer.close()
        owner.close()


def test_a_peer_role_cannot_insert_into_another_queue(queue_database: tuple[str, str]) -> None:
    from messaging.sqlqueue import SqlQueueBroker

    owner_url, peer_url = queue_database
    peer = SqlQueueBroker(peer_url)
    owner = SqlQueueBroker(owner_url)
    try:
        with pytest.raises(TransportError, match="row-level security"):
            peer.enqueue([(message("m1"), DAVE)])
        with pytest.raises(TransportError, match="row-level security"):
            peer.enqueue([(message("m2"), CAROL), (message("m3"), DAVE)])  # all or nothing
        assert (owner.depth(CAROL), owner.depth(DAVE)) == (0, 0)
    finally:
        peer.close()
        owner.close()


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT frame FROM ff_queue_messages",
        "DELETE FROM ff_queue_messages",
        "UPDATE ff_queue_messages SET lease_owner = 'me'",
        "SELECT frame FROM ff_queue_dead_letters",
        "INSERT INTO ff_queues (name, created_at) VALUES ('O=Mallory,L=Rome,C=IT', 0)",
        "CREATE TABLE peer_made (x int)",
    ],
)
def test_a_peer_role_may_do_nothing_else(queue_database: tuple[str, str], statement: str) -> None:
    _, peer_url = queue_database
    engine = create_engine(peer_url)
    try:
        with pytest.raises(ProgrammingError, match="permission denied"), engine.begin() as c:
            c.execute(text(statement))
    finally:
        engine.dispose()


def test_other_roles_keep_their_rights_once_row_security_is_on(
    queue_database: tuple[str, str],
) -> None:
    """A role that is not the tables' owner (a node of a shared queue database) still works."""
    from messaging.sqlqueue import SqlQueueBroker

    owner_url, _ = queue_database
    role = f"ff_node_{uuid.uuid4().hex[:8]}"
    owner_engine = create_engine(owner_url)
    with owner_engine.begin() as connection:
        connection.execute(text(f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'node-pw'"))
        connection.execute(text(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"'))
        connection.execute(text(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"'))
    node_url = make_url(owner_url).set(username=role, password="node-pw")
    node = SqlQueueBroker(node_url.render_as_string(hide_password=False))
    try:
        node.enqueue([(message("m1"), DAVE), (message("m2"), CAROL)])
        claim = node.claim(DAVE, "consumer-1", 10, 60.0)
        assert len(claim.rows) == 1
        node.acknowledge(DAVE, [claim.rows[0][0]])
        assert (node.depth(DAVE), node.depth(CAROL)) == (0, 1)
    finally:
        node.close()
        with owner_engine.begin() as connection:
            connection.execute(text(f'DROP OWNED BY "{role}"'))
            connection.execute(text(f'DROP ROLE "{role}"'))
        owner_engine.dispose()
