"""Persistent vector, map and session table: same answers as list and dict, old values kept."""

from __future__ import annotations

import hashlib
import pickle

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persistence.checkpoint_codec import decode_checkpoint, encode_checkpoint
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import Receive
from statemachine.persistent import EMPTY_MAP, PMap, PVector
from statemachine.session_messages import (
    SessionData,
    SessionEnd,
)
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

# Sizes around the trie's boundaries: one leaf (32), one level of leaves (1024), and past.
BOUNDARY_SIZES = [0, 1, 31, 32, 33, 63, 64, 65, 1023, 1024, 1025, 1100, 32 * 1024 + 1]


@pytest.mark.parametrize("size", BOUNDARY_SIZES)
def test_vector_built_at_once_or_by_appends_holds_the_same_items(size: int) -> None:
    items = list(range(size))
    built = PVector(items)
    appended: PVector[int] = PVector()
    for item in items:
        appended = appended.append(item)
    for vector in (built, appended):
        assert len(vector) == size
        assert list(vector) == items
        assert vector == tuple(items) and tuple(items) == vector
        assert hash(vector) == hash(tuple(items))
        if size:
            assert vector[0] == 0 and vector[-1] == size - 1 and vector[size // 2] == size // 2
    assert built == appended
    if size:
        assert built.set(size - 1, -1).to_tuple() == (*items[:-1], -1)
        assert built.to_tuple() == tuple(items)  # the original is unchanged
    with pytest.raises(IndexError):
        built[size]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers()),
            st.tuples(st.just("set"), st.integers(min_value=0), st.integers()),
        ),
        max_size=120,
    ),
    st.integers(min_value=0, max_value=70),
)
def test_vector_behaves_like_a_list_and_never_changes_once_built(
    operations: list[tuple[object, ...]], start: int
) -> None:
    model = list(range(start))
    vector = PVector(model)
    history = [(vector, list(model))]
    for operation in operations:
        if operation[0] == "append":
            vector = vector.append(operation[1])
            model.append(operation[1])  # type: ignore[arg-type]
        elif model:
            index = operation[1] % len(model)  # type: ignore[operator]
            vector = vector.set(index, operation[2])
            model[index] = operation[2]  # type: ignore[call-overload]
        history.append((vector, list(model)))
    for old, expected in history:
        assert list(old) == expected and len(old) == len(expected)
        assert [old[i] for i in range(-len(expected), len(expected))] == expected * 2
        assert old[1:5] == tuple(expected[1:5])
    assert pickle.loads(pickle.dumps(vector)) == vector


class Colliding:
    """A key whose hash is chosen, to force full 64-bit hash collisions."""

    def __init__(self, name: str, hash_: int) -> None:
        self.name, self.hash_ = name, hash_

    def __hash__(self) -> int:
        return self.hash_

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Colliding) and other.name == self.name

    def __repr__(self) -> str:
        return f"Colliding({self.name!r}, {self.hash_})"


keys = st.one_of(
    st.text(max_size=4),
    st.builds(Colliding, st.sampled_from("abcd"), st.sampled_from([1, 33, 1 << 40, -1])),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(keys, st.integers()), max_size=150))
def test_map_behaves_like_a_dict_and_never_changes_once_built(
    bindings: list[tuple[object, int]],
) -> None:
    model: dict[object, int] = {}
    pmap: PMap[object, int] = EMPTY_MAP
    history = [(pmap, dict(model))]
    for key, value in bindings:
        pmap = pmap.set(key, value)
        model[key] = value
        history.append((pmap, dict(model)))
    for old, expected in history:
        assert len(old) == len(expected)
        assert sorted(map(repr, old)) == sorted(map(repr, expected))
        for key, value in expected.items():
            assert old.get(key) == value and key in old
        assert old.get("never a key") is None and "never a key" not in old
    rebuilt: PMap[object, int] = EMPTY_MAP
    for key, value in reversed(list(model.items())):
        rebuilt = rebuilt.set(key, value)
    assert rebuilt == pmap


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
    # Small batches into a big table take the one-by-one path of put_many, big ones the bulk.
    model = {f"s{i}": session(f"s{i}") for i in range(prefill)}  # ordered like a checkpoint's
    table = SessionTable(model.values())
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
    checkpoint = sample_checkpoint()
    blob = encode_checkpoint(checkpoint)
    assert len(blob) == 11315
    assert hashlib.sha256(blob).hexdigest() == SAMPLE_BLOB_SHA256
    decoded = decode_checkpoint(blob)
    assert decoded == checkpoint
    assert isinstance(decoded.sessions, SessionTable) and isinstance(decoded.journal, PVector)
    assert decoded.session("A-f1.s7") == checkpoint.sessions[7]
    changed = decoded.with_session(attrs.evolve(decoded.sessions[3], closed_by_us=True))
    assert decode_checkpoint(encode_checkpoint(changed)) == changed != decoded
