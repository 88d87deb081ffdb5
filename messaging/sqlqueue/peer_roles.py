"""Peer roles on a node's own SQL queue database (PostgreSQL): insert into its inbound only.

In the peer-to-peer topology a node whose inbound is a SQL queue on PostgreSQL gives each
peer a database role of its own. :func:`peer_role_statements` is what its operator runs (as
the owner of the queue tables) to make one: the role may log in, see which queues exist, and
insert messages into the node's queue; row-level security refuses an insert into any other
queue, and the role has no right to read, change or delete a message, or to touch the dead
letters.

Row-level security is switched on for ``ff_queue_messages`` with a permissive policy for
every role (so roles that used the table before, such as the nodes of a shared queue
database, keep their rights) and a restrictive policy per peer role that limits its inserts
to the one queue.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text

from messaging.sqlqueue.tables import metadata, queue_messages, queues

__all__ = ["apply_statements", "peer_role_statements"]

EVERYONE_POLICY = "ff_queue_messages_everyone"
"""The permissive policy that keeps every role's rights once row-level security is on."""


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def peer_role_statements(role: str, password: str, queue: str) -> list[str]:
    """The SQL making ``role`` a peer account that may insert into ``queue`` only."""
    if not role or not password or not queue:
        raise ValueError("a peer role needs a name, a password and the node's queue")
    role_id = _identifier(role)
    messages = _identifier(queue_messages.name)
    policy = _identifier(f"ff_peer_{role}"[:63])
    sequence = _identifier(f"{queue_messages.name}_id_seq")
    return [
        f"CREATE ROLE {role_id} LOGIN PASSWORD {_literal(password)}",
        f"GRANT SELECT ON {_identifier(queues.name)} TO {role_id}",
        f"GRANT INSERT ON {messages} TO {role_id}",
        f"GRANT USAGE ON SEQUENCE {sequence} TO {role_id}",
        f"ALTER TABLE {messages} ENABLE ROW LEVEL SECURITY",
        f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_policies WHERE tablename = "
        f"{_literal(queue_messages.name)} AND policyname = {_literal(EVERYONE_POLICY)}) THEN "
        f"CREATE POLICY {_identifier(EVERYONE_POLICY)} ON {messages} FOR ALL TO PUBLIC "
        f"USING (true) WITH CHECK (true); END IF; END $$",
        f"CREATE POLICY {policy} ON {messages} AS RESTRICTIVE FOR INSERT TO {role_id} "
        f"WITH CHECK (queue = {_literal(queue)})",
    ]


def apply_statements(url: str, statements: Sequence[str]) -> None:
    """Run ``statements`` in one transaction on the database at ``url`` (its tables made)."""
    from foundation.engine import create_tables, open_engine

    engine = open_engine(url)
    try:
        create_tables(engine, metadata)
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()
