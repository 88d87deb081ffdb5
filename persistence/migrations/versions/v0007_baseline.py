"""Schema version 7, the baseline: the node tables as they were before fiberflow used Alembic.

A database made before then (``node_schema_version`` = 7, no ``alembic_version`` table) is
recognised as this revision and stamped with it before an upgrade, so these statements only
ever run on an empty database (tests, and a node database built from the migrations). They
are a frozen copy: column widths are the limits of that time, written out as numbers.

Revision ID: 0007
Revises: (none)
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = None
branch_labels = None
depends_on = None

_TABLES = (
    "node_checkpoint_blobs",
    "node_checkpoints",
    "node_dead_letters",
    "node_flow_exceptions",
    "node_flow_requests",
    "node_flow_results",
    "node_message_ids",
    "node_operator_requests",
    "node_outbox",
    "node_partitions",
    "node_paused_flows",
    "node_running_flows",
    "node_schedules",
    "node_schema_version",
    "node_settings",
    "node_workers",
)


def upgrade() -> None:
    """Create the node tables of schema version 7 and record the version."""
    op.create_table(
        "node_checkpoint_blobs",
        sa.Column("flow_id", sa.String(length=64), nullable=False),
        sa.Column("blob", sa.LargeBinary(), nullable=False),
        sa.Column("mac", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("flow_id"),
    )
    op.create_table(
        "node_checkpoints",
        sa.Column("flow_id", sa.String(length=64), nullable=False),
        sa.Column("flow_class", sa.String(length=300), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("progress_step", sa.String(length=200), nullable=True),
        sa.Column("suspended_on", sa.String(length=20), nullable=True),
        sa.Column("waiting_for", sa.Text(), nullable=True),
        sa.Column("wake_at", sa.BigInteger(), nullable=True),
        sa.Column("journal_length", sa.Integer(), nullable=False),
        sa.Column("checkpoint_bytes", sa.Integer(), nullable=False),
        sa.Column("checkpoint_version", sa.BigInteger(), nullable=False),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("flow_id"),
    )
    op.create_table(
        "node_dead_letters",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("message_id", sa.String(length=200), nullable=False),
        sa.Column("sender", sa.String(length=300), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("received_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "node_flow_exceptions",
        sa.Column("flow_id", sa.String(length=64), nullable=False),
        sa.Column("flow_class", sa.String(length=300), nullable=False),
        sa.Column("error_kind", sa.String(length=30), nullable=False),
        sa.Column("exception_class", sa.String(length=300), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("failed_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("flow_id"),
    )
    op.create_table(
        "node_flow_requests",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("flow_class", sa.String(length=300), nullable=False),
        sa.Column("arguments", sa.LargeBinary(), nullable=False),
        sa.Column("requested_at", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=True),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("request_id"),
    )
    op.create_index(
        "ix_node_flow_requests_started_at", "node_flow_requests", ["started_at"], unique=False
    )
    op.create_table(
        "node_flow_results",
        sa.Column("flow_id", sa.String(length=64), nullable=False),
        sa.Column("flow_class", sa.String(length=300), nullable=False),
        sa.Column("result", sa.LargeBinary(), nullable=False),
        sa.Column("completed_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("flow_id"),
    )
    op.create_table(
        "node_message_ids",
        sa.Column("message_id", sa.String(length=200), nullable=False),
        sa.Column("sender", sa.String(length=300), nullable=False),
        sa.Column("session_id", sa.String(length=120), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("inserted_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
    )
    op.create_index(
        "node_message_ids_session", "node_message_ids", ["session_id", "sequence"], unique=False
    )
    op.create_table(
        "node_operator_requests",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=20), nullable=False),
        sa.Column("flow_id", sa.String(length=64), nullable=True),
        sa.Column("requested_at", sa.BigInteger(), nullable=False),
        sa.Column("done_at", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("request_id"),
    )
    op.create_index(
        "ix_node_operator_requests_done_at", "node_operator_requests", ["done_at"], unique=False
    )
    op.create_table(
        "node_outbox",
        sa.Column("message_id", sa.String(length=200), nullable=False),
        sa.Column("target", sa.String(length=300), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
    )
    op.create_table(
        "node_partitions",
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("partition"),
    )
    op.create_table(
        "node_paused_flows",
        sa.Column("flow_id", sa.String(length=64), nullable=False),
        sa.Column("paused_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("flow_id"),
    )
    op.create_table(
        "node_running_flows",
        sa.Column("flow_id", sa.String(length=64), nullable=False),
        sa.Column("since", sa.BigInteger(), nullable=False),
        sa.Column("location", sa.Text(), nullable=False),
        sa.Column("noted_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("flow_id"),
    )
    op.create_table(
        "node_schedules",
        sa.Column("schedule_id", sa.String(length=64), nullable=False),
        sa.Column("flow_class", sa.String(length=300), nullable=False),
        sa.Column("arguments", sa.LargeBinary(), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("spec", sa.String(length=200), nullable=False),
        sa.Column("missed", sa.String(length=10), nullable=False),
        sa.Column("next_slot", sa.BigInteger(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("fired", sa.BigInteger(), nullable=False),
        sa.Column("last_slot", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("schedule_id"),
    )
    op.create_index("ix_node_schedules_next_slot", "node_schedules", ["next_slot"], unique=False)
    version = op.create_table(
        "node_schema_version",
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("applied_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("version"),
    )
    op.create_table(
        "node_settings",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "node_workers",
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("boot_id", sa.String(length=64), nullable=False),
        sa.Column("process_start", sa.BigInteger(), nullable=False),
        sa.Column("pid_namespace", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("renewed_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("shared", sa.Boolean(), nullable=False),
        sa.Column("flow_counts", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("worker_id"),
    )
    op.bulk_insert(version, [{"version": 7, "applied_at": round(time.time() * 1000)}])


def downgrade() -> None:
    """Drop every node table (back to an empty database)."""
    for name in reversed(_TABLES):
        op.drop_table(name)
