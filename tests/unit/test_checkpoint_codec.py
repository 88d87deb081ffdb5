"""Checkpoint blobs in format 2 (positional msgpack arrays): every part of a checkpoint comes
back as it was, format 1 is still read, and what format 2 cannot carry is written in format 1."""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs
import msgpack
import pytest

from foundation.serialization import SerializationError
from persistence.checkpoint_codec import (
    CHECKPOINT_FORMAT,
    FIRST_FORMAT,
    decode_checkpoint,
    encode_checkpoint,
    encode_checkpoint_format_1,
)
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import Receive, RetryPolicy, RunOperation, Sleep
from statemachine.session_messages import (
    ConfirmSession,
    SessionData,
    SessionEnd,
    SessionErrorBody,
    SessionReject,
)
from statemachine.state import (
    Checkpoint,
    EarlyMessage,
    FlowStatus,
    InitiatedBy,
    JournalEntry,
    Pending,
    Raised,
    SessionState,
    StartedLocally,
    Value,
)
from tests.unit.test_persistent import sample_checkpoint

SAMPLE_FORMAT_2_SHA256 = "42fc87d2963bb6717423c0d0e2d7fdb4979cc931e61c906d73af4d8d457b3b7d"
"""Of ``encode_checkpoint(sample_checkpoint())`` in format 2 (6,149 bytes; 11,315 in format 1).
A change here changes what every node writes: bump CHECKPOINT_FORMAT and keep reading this."""

ERROR = FlowError(ErrorKind.FLOW_EXCEPTION, "app.Refused", "no", "e-1")


def every_part() -> Checkpoint:
    """A checkpoint holding one of every kind of value a checkpoint can hold."""
    session = SessionState(
        "t-f2.s0.r",
        "t-f2.s0",
        "O=Alice,L=London,C=GB",
        False,
        "app.Initiator",
        2,
        "app",
        initial_sent=True,
        confirmed=True,
        peer_flow_version=3,
        peer_app_name="their-app",
        closed_by_us=False,
        next_send_sequence=4,
        next_receive_sequence=5,
        inbox=(
            SessionData(b"\x00data"),
            SessionEnd(),
            SessionErrorBody(ERROR),
            SessionReject("rejected"),
        ),
        early=(EarlyMessage(7, ConfirmSession(1, "x")), EarlyMessage(9, SessionData(b"z"))),
    )
    return Checkpoint(
        "f2",
        InitiatedBy("app.Responder", "t-f2.s0.r", "O=Alice,L=London,C=GB", 3, "their-app"),
        FlowStatus.HOSPITALIZED,
        1234.5,
        sessions=(session,),
        journal=(
            JournalEntry(("Send", ("t-f2.s0.r", "abcd")), Value(None)),
            JournalEntry(("Receive", "t-f2.s0.r"), Value((b"a", b"b"))),
            JournalEntry(("RecordValue", "now"), Value(1.5)),
            JournalEntry(("RecordValue", "uuid"), Value("u-1")),
            JournalEntry(("Sleep", 2.0), Raised(ERROR)),
            JournalEntry(("Nested", (1, (2, (3, True)), b"", None)), Value(((), (("x",),)))),
        ),
        pending=Pending(Sleep(2.0), 1236.5),
        next_session_index=1,
        error=FlowError(ErrorKind.INTERNAL, "builtins.KeyError", "'k'"),
        progress_step="step ✓",
        session_tag="t",
        version=17,
    )


@pytest.mark.parametrize("checkpoint", [sample_checkpoint(), every_part()], ids=["sample", "all"])
def test_a_checkpoint_comes_back_as_it_was_in_format_2(checkpoint: Checkpoint) -> None:
    blob = encode_checkpoint(checkpoint)
    assert msgpack.unpackb(blob)[0] == CHECKPOINT_FORMAT
    decoded = decode_checkpoint(blob)
    assert decoded == checkpoint
    assert tuple(decoded.journal) == tuple(checkpoint.journal)  # tuples stay tuples
    assert encode_checkpoint(decoded) == blob


def test_the_sample_blob_of_format_2_is_pinned() -> None:
    blob = encode_checkpoint(sample_checkpoint())
    assert len(blob) == 6149
    assert hashlib.sha256(blob).hexdigest() == SAMPLE_FORMAT_2_SHA256


@pytest.mark.parametrize("checkpoint", [sample_checkpoint(), every_part()], ids=["sample", "all"])
def test_a_blob_of_format_1_is_still_read(checkpoint: Checkpoint) -> None:
    blob = encode_checkpoint_format_1(checkpoint)
    assert msgpack.unpackb(blob, ext_hook=lambda c, d: None)[0] == FIRST_FORMAT
    assert decode_checkpoint(blob) == checkpoint


def test_what_format_2_cannot_carry_is_written_in_format_1() -> None:
    pending = Pending(Receive(("s",), 5.0), None)
    big = Checkpoint(
        "f3",
        StartedLocally("app.Flow", b""),
        FlowStatus.SUSPENDED,
        1.0,
        journal=(JournalEntry(("RecordValue", "n"), Value(2**70)),),
        pending=pending,
    )
    blob = encode_checkpoint(big)
    assert msgpack.unpackb(blob, ext_hook=lambda c, d: None)[0] == FIRST_FORMAT
    assert decode_checkpoint(blob) == big


@pytest.mark.parametrize(
    "blob",
    [
        bytes([0x9D, CHECKPOINT_FORMAT]),  # claims format 2, then stops
        msgpack.packb([CHECKPOINT_FORMAT, *range(12)]),
        msgpack.packb([CHECKPOINT_FORMAT, "f", [9], *([None] * 10)]),
    ],
)
def test_a_broken_blob_of_format_2_is_refused_with_a_reason(blob: bytes) -> None:
    with pytest.raises(SerializationError, match="not a checkpoint blob of format 2"):
        decode_checkpoint(blob)


def long_flow(entries: int, flow_id: str = "long") -> Checkpoint:
    return Checkpoint(
        flow_id,
        StartedLocally("app.Looping", b""),
        FlowStatus.SUSPENDED,
        1.0,
        journal=[JournalEntry(("Sleep", 0.05), Value(None)) for _ in range(entries)],
        pending=Pending(Sleep(0.05), 2.0),
    )


@pytest.mark.parametrize("added", [0, 1, 15, 16, 70_000])
def test_a_long_journal_is_packed_once_and_the_blob_is_what_packing_it_whole_makes(
    added: int,
) -> None:
    from persistence import checkpoint_codec

    cache = checkpoint_codec.JournalCache()
    first = long_flow(checkpoint_codec.JournalCache.MIN_ENTRIES + 3, f"long-{added}")
    assert cache.encode(first) == msgpack.packb(checkpoint_codec._checkpoint(first))
    grown = attrs.evolve(
        first,
        journal=first.journal.extend(
            JournalEntry(("Receive", f"s{i}"), Value((b"x", i))) for i in range(added)
        ),
        version=first.version + 1,
    )
    blob = cache.encode(grown)  # reuses the first's packed entries
    assert blob == msgpack.packb(checkpoint_codec._checkpoint(grown))
    assert decode_checkpoint(blob) == grown


def test_a_journal_built_apart_is_packed_whole() -> None:
    from persistence import checkpoint_codec

    cache = checkpoint_codec.JournalCache()
    flow = long_flow(100)
    cache.encode(flow)
    # Read back from its blob (a restart, a retry): equal entries, other objects. A journal
    # that differs where the cache was made must not reuse it either.
    again = decode_checkpoint(encode_checkpoint(flow))
    changed = attrs.evolve(again, journal=[JournalEntry(("Other",), Value(1))] * 100)
    assert cache.encode(changed) == msgpack.packb(checkpoint_codec._checkpoint(changed))
    assert decode_checkpoint(cache.encode(changed)) == changed


def test_the_cache_keeps_at_most_its_byte_limit() -> None:
    from persistence import checkpoint_codec

    cache = checkpoint_codec.JournalCache()
    cache.MAX_BYTES = 5_000  # type: ignore[misc]
    for index in range(20):
        cache.encode(long_flow(100, f"f{index}"))
    assert 0 < cache._bytes <= 5_000
    assert len(cache._journals) < 20 and "f19" in cache._journals


def test_a_finished_flow_leaves_nothing_in_the_process_cache(tmp_path: Path) -> None:
    """A long flow's packed journal is kept while it runs and dropped when its checkpoint goes."""
    from flows.testing import MockNetwork
    from persistence import checkpoint_codec
    from tests.cordapp import EchoFlow

    net = MockNetwork(cordapps=["tests.cordapp"], directory=tmp_path, database="sqlite")
    try:
        alice = net.create_node("O=Alice,L=London,C=GB")
        bob = net.create_node("O=Bob,L=New York,C=US")
        words = [f"w{i}" for i in range(checkpoint_codec.JournalCache.MIN_ENTRIES + 10)]
        handle = alice.start_flow(EchoFlow(bob.party, words))
        kept = False
        for _ in range(10_000):
            kept = kept or handle.flow_id in checkpoint_codec._JOURNALS._journals
            if not net.run_once() and not alice.node.manager.live_flows():
                break
        assert handle.result() == [word.upper() for word in words]
        assert kept, "the long journal was never cached while the flow ran"
        assert handle.flow_id not in checkpoint_codec._JOURNALS._journals
    finally:
        net.stop_nodes()


def waiting_on_an_operation(backing_off: bool) -> Checkpoint:
    """A flow suspended on an external operation, its policy and progress all set."""
    policy = RetryPolicy(5, 0.5, 3.0, 30.0, 0.25, retry_on=(ConnectionError, "app.Busy"))
    request = RunOperation("charge", 2, "app.gateway.charge", 7.5, policy, 3, backing_off)
    return Checkpoint(
        "f-op",
        StartedLocally("app.Flow", b""),
        FlowStatus.SUSPENDED,
        1.0,
        journal=(JournalEntry(("RunOperation", "quote", 0, "app.gateway.quote"), Value(b"\x01")),),
        pending=Pending(request, 1240.0),
    )


@pytest.mark.parametrize("backing_off", [False, True], ids=["running", "backing-off"])
def test_a_flow_waiting_on_an_operation_comes_back_as_it_was(backing_off: bool) -> None:
    checkpoint = waiting_on_an_operation(backing_off)
    blob = encode_checkpoint(checkpoint)
    assert msgpack.unpackb(blob)[0] == CHECKPOINT_FORMAT
    assert decode_checkpoint(blob) == checkpoint
    assert decode_checkpoint(encode_checkpoint_format_1(checkpoint)) == checkpoint
