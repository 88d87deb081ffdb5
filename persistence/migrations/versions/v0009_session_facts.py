"""Schema version 9: ``session_facts`` on checkpoint, result and exception rows.

The facts of a flow's sessions (messages sent and taken in, whether the peer confirmed) as
JSON text, written with the row, for the analytics checks once the checkpoint blob is gone.
Nullable: rows written before the upgrade have none (the checks then judge nothing of them).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TABLES = ("node_checkpoints", "node_flow_results", "node_flow_exceptions")

_VERSION = sa.table(
    "node_schema_version", sa.column("version", sa.Integer), sa.column("applied_at", sa.BigInteger)
)


def _set_version(version: int) -> None:
    op.execute(_VERSION.delete())
    op.execute(_VERSION.insert().values(version=version, applied_at=round(time.time() * 1000)))


def upgrade() -> None:
    """Add the ``session_facts`` columns; the schema version becomes 9."""
    for name in _TABLES:
        with op.batch_alter_table(name) as table:
            table.add_column(sa.Column("session_facts", sa.Text(), nullable=True))
    _set_version(9)


def downgrade() -> None:
    """Drop the ``session_facts`` columns (the facts stored are lost); back to version 8."""
    for name in _TABLES:
        with op.batch_alter_table(name) as table:
            table.drop_column("session_facts")
    _set_version(8)
