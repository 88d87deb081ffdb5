"""Continuing as new: a flow that loops for ever keeps a short journal and a short replay."""

from __future__ import annotations

from pathlib import Path

from flows.testing import MockNetwork
from statemachine.state import Checkpoint, StartedLocally
from tests.conftest import CORDAPPS
from tests.cordapp import KEYS_SEEN, AskToContinueFlow, LoopingFlow

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


def journal_lengths(net: MockNetwork) -> list[int]:
    """Collects the journal length of every checkpoint Alice writes from now on."""
    lengths: list[int] = []
    store = net.nodes[0].node.database.checkpoints

    def note(checkpoint: Checkpoint, _: int) -> None:
        lengths.append(len(checkpoint.journal))

    store.checkpoint_listeners.append(note)
    return lengths


def test_a_looping_flow_keeps_its_journal_short(tmp_path: Path, backend: str) -> None:
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path, database=backend)
    alice = net.create_node(ALICE)
    lengths = journal_lengths(net)
    handle = alice.start_flow(LoopingFlow(50))
    net.run_network()
    assert handle.result() == 50
    assert len(lengths) > 50 and max(lengths) <= 2  # each run: its progress step, its sleep
    net.stop_nodes()


def test_a_flow_continued_as_new_resumes_its_current_run_after_a_restart(tmp_path: Path) -> None:
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path, hibernate_after=0)
    alice = net.create_node(ALICE)
    handle = alice.start_flow(LoopingFlow(6))
    net.run_network(advance_clock=False)  # run 0 sleeps
    for _ in range(3):
        net.clock.advance(1.0)
        net.run_network(advance_clock=False)
    ((flow_id, _, _),) = alice.checkpoints()
    stored = alice.node.database.checkpoints.load_checkpoint(flow_id)
    assert stored is not None and stored.checkpoint is not None
    origin = stored.checkpoint.origin
    assert isinstance(origin, StartedLocally) and origin.generation == 3
    assert stored.checkpoint.progress_step == "run 3"  # only this run's steps are journaled
    alice.restart()
    net.run_network()
    assert handle.result() == 6
    net.stop_nodes()


def test_each_run_gives_its_operations_keys_of_their_own(tmp_path: Path) -> None:
    KEYS_SEEN.clear()
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path)
    alice = net.create_node(ALICE)
    handle = alice.start_flow(LoopingFlow(2, operations=True))
    net.run_network()
    assert handle.result() == 2
    flow_id = handle.flow_id
    assert [f"{flow_id}:op:0", f"{flow_id}.1:op:0", f"{flow_id}.2:op:0"] == KEYS_SEEN
    net.stop_nodes()


def test_a_responder_cannot_continue_as_new(tmp_path: Path) -> None:
    net = MockNetwork(cordapps=CORDAPPS, directory=tmp_path)
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(AskToContinueFlow(bob.party))
    net.run_network()
    answer = handle.result()
    assert answer.startswith("refused: ") and "it is a responder" in answer
    net.stop_nodes()


def test_the_generation_survives_both_blob_formats_and_is_left_out_while_0() -> None:
    from persistence.checkpoint_codec import (
        decode_checkpoint,
        encode_checkpoint,
        encode_checkpoint_format_1,
    )
    from statemachine.state import FlowStatus

    first = Checkpoint("f1", StartedLocally("a.B", b"\x90"), FlowStatus.RUNNABLE, 1.0)
    later = Checkpoint("f1", StartedLocally("a.B", b"\x90", 7), FlowStatus.RUNNABLE, 1.0)
    for encode in (encode_checkpoint, encode_checkpoint_format_1):
        assert decode_checkpoint(encode(later)) == later
        assert decode_checkpoint(encode(first)) == first
        assert len(encode(later)) == len(encode(first)) + 1  # one msgpack byte, only if not 0
