"""Schema version 8: ``node_flow_exceptions.traceback``, a failed flow's formatted traceback.

Nullable: failures recorded before the upgrade have none.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_VERSION = sa.table(
    "node_schema_version", sa.column("version", sa.Integer), sa.column("applied_at", sa.BigInteger)
)


def _set_version(version: int) -> None:
    op.execute(_VERSION.delete())
    op.execute(_VERSION.insert().values(version=version, applied_at=round(time.time() * 1000)))


def upgrade() -> None:
    """Add the ``traceback`` column; the schema version becomes 8."""
    with op.batch_alter_table("node_flow_exceptions") as table:
        table.add_column(sa.Column("traceback", sa.Text(), nullable=True))
    _set_version(8)


def downgrade() -> None:
    """Drop the ``traceback`` column (the tracebacks stored are lost); back to version 7."""
    with op.batch_alter_table("node_flow_exceptions") as table:
        table.drop_column("traceback")
    _set_version(7)
