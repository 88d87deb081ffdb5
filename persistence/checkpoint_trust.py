"""Whether a stored checkpoint can be trusted: its MAC, its decoding, its freshness.

A checkpoint blob carries an HMAC bound to its flow and its version (:class:`CheckpointSeal`),
so a blob changed outside the node, moved from another flow or put back from an older version
does not match the row it sits in. A checkpoint that matches can still be stale: older than
what the node committed for its flow since (:func:`checkpoint_staleness`). The store reports
an untrusted checkpoint as a fact; the transition keeps a placeholder of its flow in the
hospital (:func:`statemachine.transitions.starting.load_flow`), and the blob is kept as
found, for the operator. See docs/security.md.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import Sequence

import attrs
from sqlalchemy import Connection, select

from foundation.engine import chunks
from persistence import schema
from persistence.checkpoint_codec import decode_checkpoint
from statemachine.state import Checkpoint
from statemachine.transitions.starting import UNTRUSTED_CHECKPOINT

CHECKPOINT_INTEGRITY_ERROR = UNTRUSTED_CHECKPOINT
"""The error class recorded for a flow whose checkpoint could not be trusted.

(Stored in databases as it is: it keeps the module name it was first written with.)"""

MAC_CONTEXT = b"fiberflow-checkpoint-v2"
"""Domain separation of checkpoint MACs (v2: the version is bound in)."""


@attrs.frozen
class CheckpointSeal:
    """Seals checkpoint blobs with a MAC under the node's key, and checks them.

    Without a key (``None``) nothing is sealed and every MAC is accepted.
    """

    key: bytes | None = attrs.field(repr=False)

    def mac(self, flow_id: str, version: int, blob: bytes) -> bytes | None:
        """The MAC of version ``version`` of a flow's checkpoint blob (None without a key).

        It binds the blob to its flow and to its version: a blob moved to another flow, or
        an older blob put back, does not match the row it sits in.
        """
        if self.key is None:
            return None
        message = b"\0".join((MAC_CONTEXT, flow_id.encode(), str(version).encode(), blob))
        return hmac.new(self.key, message, "sha256").digest()

    def open(
        self, flow_id: str, version: int, blob: bytes, mac: bytes | None
    ) -> tuple[Checkpoint | None, str | None]:
        """The checkpoint in a stored row, or None and why it cannot be trusted.

        Untrusted: the MAC does not match, the blob does not decode, or it holds another
        flow's checkpoint or another version than the row says the node committed.
        """
        expected = self.mac(flow_id, version, blob)
        if expected is not None and (mac is None or not hmac.compare_digest(expected, mac)):
            return None, self._mac_problem(flow_id, version, blob, mac)
        try:
            checkpoint = decode_checkpoint(blob)
        except Exception as error:  # a blob that breaks the decoder in any way is untrusted
            return None, f"undecodable checkpoint: {type(error).__name__}: {error}"
        if checkpoint.flow_id != flow_id:
            return None, f"the checkpoint stored for {flow_id} is flow {checkpoint.flow_id}'s"
        if checkpoint.version != version:
            return None, (
                f"stale checkpoint: its blob is version {checkpoint.version}, its row says the "
                f"node committed version {version}"
            )
        return checkpoint, None

    def _mac_problem(self, flow_id: str, version: int, blob: bytes, mac: bytes | None) -> str:
        """Why a MAC does not match: an older version put back, or a changed blob."""
        if mac is not None:
            with contextlib.suppress(Exception):
                older = decode_checkpoint(blob).version
                if older < version and hmac.compare_digest(
                    mac, self.mac(flow_id, older, blob) or b""
                ):
                    return (
                        f"stale checkpoint: an older genuine checkpoint (version {older}) was "
                        f"put back, the node committed version {version}"
                    )
        return (
            "checkpoint MAC does not match: the blob was changed outside this node "
            "(or written with another key)"
        )


def checkpoint_staleness(
    connection: Connection, checkpoints: Sequence[Checkpoint]
) -> dict[str, str]:
    """Why each of ``checkpoints`` is older than what the node committed for its flow.

    Facts the node writes in the same transactions as its checkpoints: a finished flow's
    stored outcome, and the dedup id of every message a flow consumed. A checkpoint whose
    flow has an outcome, or that does not know a message recorded as consumed on one of its
    sessions, is stale. Flows not in the result are fresh.
    """
    problems: dict[str, str] = {}
    ids = [c.flow_id for c in checkpoints]
    for table, what in (
        (schema.node_flow_results, "completed"),
        (schema.node_flow_exceptions, "failed"),
    ):
        for chunk in chunks(ids):
            for flow_id in connection.execute(
                select(table.c.flow_id).where(table.c.flow_id.in_(chunk))
            ).scalars():
                problems[flow_id] = (
                    f"stale checkpoint: the flow already {what} (its outcome is stored); a "
                    "finished flow's checkpoint never runs again"
                )
    expected: dict[str, tuple[str, int, frozenset[int]]] = {}
    for checkpoint in checkpoints:
        for session in checkpoint.sessions:
            early = frozenset(e.sequence for e in session.early)
            expected[session.session_id] = (
                checkpoint.flow_id,
                session.next_receive_sequence,
                early,
            )
    table = schema.node_message_ids
    for chunk in chunks(list(expected)):
        query = (
            select(table.c.session_id, table.c.sequence)
            .where(table.c.session_id.in_(chunk))
            .order_by(table.c.session_id, table.c.sequence)
        )
        for session_id, sequence in connection.execute(query):
            flow_id, next_receive, early = expected[session_id]
            if sequence >= next_receive and sequence not in early and flow_id not in problems:
                problems[flow_id] = (
                    f"stale checkpoint: message {sequence} of session {session_id} was "
                    f"consumed, but this checkpoint expects message {next_receive} next"
                )
    return problems
