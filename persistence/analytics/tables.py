"""What the analytics read of a node database: :data:`TABLES`, and the error when they cannot.

:data:`TABLES` names every node table the analytics read, its partition key and its columns
with their types (blobs and payloads are never read).
"""

from __future__ import annotations

STRING = "string"
"""A text column."""
LONG = "long"
"""A 64-bit integer column (millisecond times, counts, sizes)."""

TABLES: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "checkpoints": (
        "node_checkpoints",
        "flow_id",
        (
            ("flow_id", STRING),
            ("flow_class", STRING),
            ("status", STRING),
            ("progress_step", STRING),
            ("suspended_on", STRING),
            ("waiting_for", STRING),
            ("journal_length", LONG),
            ("checkpoint_bytes", LONG),
            ("error_message", STRING),
            ("created_at", LONG),
            ("updated_at", LONG),
            ("session_facts", STRING),
        ),
    ),
    "blobs": ("node_checkpoint_blobs", "flow_id", (("flow_id", STRING),)),
    "results": (
        "node_flow_results",
        "flow_id",
        (
            ("flow_id", STRING),
            ("flow_class", STRING),
            ("completed_at", LONG),
            ("session_facts", STRING),
        ),
    ),
    "exceptions": (
        "node_flow_exceptions",
        "flow_id",
        (
            ("flow_id", STRING),
            ("flow_class", STRING),
            ("error_kind", STRING),
            ("exception_class", STRING),
            ("message", STRING),
            ("failed_at", LONG),
            ("session_facts", STRING),
        ),
    ),
    "message_ids": (
        "node_message_ids",
        "message_id",
        (
            ("message_id", STRING),
            ("sender", STRING),
            ("session_id", STRING),
            ("sequence", LONG),
            ("inserted_at", LONG),
        ),
    ),
    "outbox": (
        "node_outbox",
        "message_id",
        (("message_id", STRING), ("target", STRING), ("created_at", LONG)),
    ),
    "paused": ("node_paused_flows", "flow_id", (("flow_id", STRING), ("paused_at", LONG))),
    "workers": (
        "node_workers",
        "worker_id",
        (("worker_id", STRING), ("renewed_at", LONG), ("expires_at", LONG)),
    ),
}
"""Frame name: (node table, partition key, columns read with their types). Blobs and
payloads are never read. ``session_facts`` (schema version 9) is parsed once into ``facts``
(:mod:`persistence.analytics.flow_facts`)."""


class AnalyticsLoadError(RuntimeError):
    """A node database could not be read (missing tables, no driver, a moving snapshot)."""
