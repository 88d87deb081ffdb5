"""Session table on pyrsistent: same answers as an ordered dict, old tables kept; same blobs."""

from __future__ import annotations

import hashlib
import pickle

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from pyrsistent import PVector

from persistence.checkpoint_codec import (
    decode_checkpoint,
    encode_checkpoint,
    encode_checkpoint_format_1,
)
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import Receive
from statemachine.session_messages import SessionData, SessionEnd
from statemachine.session_table import SessionTable
from statemachine.state import (
    Checkpoint,
    EarlyMessage,
    FlowStatus,
    JournalEntry,
    Pending,
    Raised,
    SessionState,
    StartedLocally,
    Value,
)


def session(name: str, sequence: int = 0) -> SessionState:
    return SessionState(
        name, f"{name}.r", "O=Bob", True, "app.F", 1, "app", next_send_sequence=sequence
    )


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 100),
    st.lists(
        st.lists(st.tuples(st.integers(0, 130), st.integers(0, 5)), min_size=1, max_size=40),
        max_size=8,
    ),
)
def test_session_table_keeps_order_and_finds_sessions_by_id(
    prefill: int, batches: list[list[tuple[int, int]]]
) -> None:
    # Batches mix replacements and new sessions (some named twice); tables cross trie leaves.
    model = {f"s{i}": session(f"s{i}") for i in range(prefill)}  # ordered like a checkpoint's
    table = SessionTable(model.values())
    history = [(table, dict(model))]
    for batch in batches:
        updates = [session(f"s{name}", sequence) for name, sequence in batch]
        table = table.put(updates[0]) if len(updates) == 1 else table.put_many(updates)
        for update in updates:
            model[update.session_id] = update
        assert table == tuple(model.values()) and list(table) == list(model.values())
        for session_id, expected in model.items():
            assert table.get(session_id) == expected
        assert table.get("missing") is None
        assert SessionTable(table) == table and SessionTable.of(table) is table
        history.append((table, dict(model)))
    for old, expected in history:  # every table built on the way is unchanged
        assert old == tuple(expected.values()) and hash(old) == hash(tuple(expected.values()))
        assert len(old) == len(expected) and all(old.get(k) == v for k, v in expected.items())
        assert old[1:5] == tuple(expected.values())[1:5]
    assert pickle.loads(pickle.dumps(table)) == table


def sample_checkpoint() -> Checkpoint:
    """A checkpoint with every kind of part (the same as in the blob fixture below)."""
    sessions = tuple(
        SessionState(
            f"A-f1.s{i}",
            f"A-f1.s{i}.r",
            "O=Bob,L=New York,C=US",
            True,
            "app.FanOutFlow",
            1,
            "app",
            initial_sent=True,
            confirmed=i % 2 == 0,
            next_send_sequence=2,
            next_receive_sequence=i % 3,
            inbox=(SessionData(bytes([i])),) if i % 4 == 0 else (),
            early=(EarlyMessage(5, SessionEnd()),) if i == 7 else (),
        )
        for i in range(40)
    )
    journal = tuple(
        JournalEntry(
            ("InitiateSession", "O=Bob,L=New York,C=US", "app.FanOutFlow"), Value(f"A-f1.s{i}")
        )
        for i in range(40)
    )
    failure = FlowError(ErrorKind.FLOW_EXCEPTION, "x.E", "boom")
    journal += (JournalEntry(("RecordValue", "now"), Raised(failure)),)
    waiting = Receive(tuple(s.session_id for s in sessions), 60.0)
    return Checkpoint(
        "f1",
        StartedLocally("app.FanOutFlow", b"\x92\x90\x80"),
        FlowStatus.SUSPENDED,
        1000.0,
        sessions=sessions,
        journal=journal,
        pending=Pending(waiting, 1060.0),
        next_session_index=40,
        progress_step="waiting",
        session_tag="A",
    )


SAMPLE_BLOB_SHA256 = "fd4a927b2175dc8e97afefc871296da552ecb8a708354d39e3eb2b9c223baecf"
"""Of ``encode_checkpoint(sample_checkpoint())`` since ``Checkpoint.version`` was added (issue
12, checkpoint freshness): the blob of commit 58ec115, when sessions and journal were plain
tuples (11,314 bytes, sha256 a55bca2f...), with one more msgpack byte, the version. The
persistent sequences changed nothing in the layout."""


def test_checkpoint_blobs_are_byte_for_byte_what_they_were_with_tuples() -> None:
    # Format 1 (still read; written only for what format 2 cannot carry).
    checkpoint = sample_checkpoint()
    blob = encode_checkpoint_format_1(checkpoint)
    assert len(blob) == 11315
    assert hashlib.sha256(blob).hexdigest() == SAMPLE_BLOB_SHA256
    decoded = decode_checkpoint(blob)
    assert decoded == checkpoint
    assert isinstance(decoded.sessions, SessionTable) and isinstance(decoded.journal, PVector)
    assert decoded.session("A-f1.s7") == checkpoint.sessions[7]
    changed = decoded.with_session(attrs.evolve(decoded.sessions[3], closed_by_us=True))
    assert decode_checkpoint(encode_checkpoint(changed)) == changed != decoded
