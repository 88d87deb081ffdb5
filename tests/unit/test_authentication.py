"""Every message is tagged by its sender and checked by its receiver; forgeries are refused."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from flows.network.identity import KeyFileError, NodeIdentity, load_or_create_identity
from flows.testing import MockNetwork, MockNode
from messaging.authentication import MessageAuthenticator
from messaging.codec import encode_session_message
from messaging.frame import encode_frame
from messaging.service import SESSION_TOPIC, Message
from persistence import schema
from samples.pingpong import PingFlow
from statemachine.session_ids import (
    identity_tag,
    initiator_session_id,
    message_id,
)
from statemachine.session_messages import (
    InitialSessionMessage,
)
from tests.helpers import assert_drained

ALICE, BOB, CAROL = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US", "O=Carol,L=Zurich,C=CH"
PING = "samples.pingpong.flows.PingFlow"


def dead_letter_reasons(node: MockNode) -> list[str]:
    table = schema.node_dead_letters
    with node.node.database.engine.connect() as connection:  # type: ignore[union-attr]
        return list(connection.execute(select(table.c.reason)).scalars())


def initial_ping(session: str) -> bytes:
    return encode_session_message(InitialSessionMessage(session, PING, 1, "samples", None))


@pytest.fixture
def network(tmp_path: Path, backend: str) -> MockNetwork:
    net = MockNetwork(cordapps=["samples.pingpong"], directory=tmp_path, database=backend)
    for name in (ALICE, BOB, CAROL):
        net.create_node(name)
    return net


def test_genuine_messages_are_authenticated_and_accepted(network: MockNetwork) -> None:
    alice, bob, _ = network.nodes
    handle = alice.start_flow(PingFlow(bob.party))
    alice.run_once()
    (initial,) = network.messaging.queued(BOB)
    assert len(initial.tag) == 32  # HMAC-SHA256
    network.run_network()
    assert handle.result() == "Pong"
    assert dead_letter_reasons(bob) == []
    network.stop_nodes()


def test_a_forged_sender_is_refused(network: MockNetwork) -> None:
    _, bob, _ = network.nodes
    mallory = NodeIdentity.generate(ALICE)  # claims to be Alice, with its own key
    session = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0.s0"
    forged = MessageAuthenticator.of(mallory, network.peer_keys).authenticate(
        Message(message_id(session, 0), SESSION_TOPIC, ALICE, initial_ping(session)), BOB
    )
    network.messaging.inject_raw(BOB, encode_frame(forged))
    network.run_network()
    assert bob.checkpoints() == [] and bob.node.manager.statistics.flows_started == 0
    (reason,) = dead_letter_reasons(bob)
    assert "bad tag" in reason
    assert_drained(network)
    network.stop_nodes()


def test_a_member_cannot_pass_a_message_off_as_another_members(network: MockNetwork) -> None:
    # Carol is a genuine member with keys of her own shared with Bob; none of them is the
    # key Alice shares with Bob, so a message she makes in Alice's name is refused.
    _, bob, carol = network.nodes
    session = "d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4d4.s0"
    posing = carol.node.authenticator.authenticate(
        Message(message_id(session, 0), SESSION_TOPIC, ALICE, initial_ping(session)), BOB
    )
    network.messaging.inject_raw(BOB, encode_frame(posing))
    network.run_network()
    (reason,) = dead_letter_reasons(bob)
    assert "bad tag" in reason and "forged sender" in reason
    assert bob.node.manager.statistics.flows_started == 0
    network.stop_nodes()


def test_unsigned_messages_and_unknown_senders_are_refused(network: MockNetwork) -> None:
    _, bob, _ = network.nodes
    session = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1.s0"
    unsigned = Message(message_id(session, 0), SESSION_TOPIC, ALICE, initial_ping(session))
    stranger = NodeIdentity.generate("O=Mallory,L=Nowhere,C=XX")
    session2 = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2.s0"
    unknown = MessageAuthenticator.of(stranger, network.peer_keys).authenticate(
        Message(message_id(session2, 0), SESSION_TOPIC, stranger.name, initial_ping(session2)), BOB
    )
    for message in (unsigned, unknown):
        network.messaging.inject_raw(BOB, encode_frame(message))
    network.run_network()
    reasons = dead_letter_reasons(bob)
    assert any("is not authenticated" in r for r in reasons)
    assert any("unknown sender" in r and "Mallory" in r for r in reasons)
    assert bob.node.manager.statistics.flows_started == 0
    network.stop_nodes()


def test_tampered_payloads_and_messages_moved_elsewhere_are_refused(network: MockNetwork) -> None:
    alice, bob, carol = network.nodes
    handle = alice.start_flow(PingFlow(bob.party))
    alice.run_once()
    (genuine,) = network.messaging.queued(BOB)
    tampered = Message(
        genuine.message_id,
        genuine.topic,
        genuine.sender,
        genuine.data.replace(b"Ping", b"Pong"),
        genuine.tag,
    )
    other_session = message_id("c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3.s0", 0)
    moved = Message(other_session, genuine.topic, genuine.sender, genuine.data, genuine.tag)
    network.messaging.inject_raw(BOB, encode_frame(tampered))
    network.messaging.inject_raw(BOB, encode_frame(moved))
    network.messaging.inject_raw(CAROL, encode_frame(genuine))  # meant for Bob, replayed to Carol
    network.run_network()
    assert handle.result() == "Pong"  # the genuine one still went through, once
    bob_reasons = dead_letter_reasons(bob)
    assert len(bob_reasons) == 2 and all("bad tag" in r for r in bob_reasons)
    (carol_reason,) = dead_letter_reasons(carol)
    assert "bad tag" in carol_reason
    assert carol.node.manager.statistics.flows_started == 0
    assert bob.node.manager.statistics.flows_started == 1
    network.stop_nodes()


def test_the_key_file_is_created_owner_only_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "alice.key.pem"
    first = load_or_create_identity(path, ALICE)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = load_or_create_identity(path, ALICE)
    assert again.public_key == first.public_key


def _identity_in_child(path: Path, start: Any, keys: Any) -> None:
    start.wait()
    try:
        keys.put(load_or_create_identity(path, ALICE).public_key)
    except Exception as error:  # reported, not raised: the parent asserts
        keys.put(f"{type(error).__name__}: {error}")


def _read_key_file_until(path: Path, stop: Any, partial: Any) -> None:
    """Read ``path`` as fast as it can; count the reads that found less than a whole key."""
    seen = 0
    while not stop.is_set():
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        if not data.rstrip().endswith(b"-----END PRIVATE KEY-----"):
            seen += 1
    partial.put(seen)


def test_processes_creating_the_key_at_once_all_get_the_same_whole_key(tmp_path: Path) -> None:
    """Node processes started together: one writes the key, the others read it, never half of it.

    A third process reads the file all the while: a key file that could be seen before it is
    whole (created, then written) shows up there as partial reads.
    """
    context = multiprocessing.get_context("fork")
    partial_reads = 0
    for attempt in range(40):
        path = tmp_path / f"race{attempt}" / "alice.key.pem"
        path.parent.mkdir()
        start, stop, keys, partial = (
            context.Event(),
            context.Event(),
            context.Queue(),
            context.Queue(),
        )
        reader = context.Process(target=_read_key_file_until, args=(path, stop, partial))
        reader.start()
        writers = [
            context.Process(target=_identity_in_child, args=(path, start, keys)) for _ in range(2)
        ]
        for writer in writers:
            writer.start()
        start.set()
        seen = [keys.get(timeout=60) for _ in writers]
        for writer in writers:
            writer.join(60)
        stop.set()
        partial_reads += partial.get(timeout=60)
        reader.join(60)
        assert all(isinstance(key, bytes) for key in seen), seen
        assert len(set(seen)) == 1
        assert sorted(p.name for p in path.parent.iterdir()) == ["alice.key.pem"]
    assert partial_reads == 0


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "alice.key.pem"
    load_or_create_identity(path, ALICE)
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_or_create_identity(path, ALICE)


def test_a_key_file_that_is_not_a_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "alice.key.pem"
    path.write_text("not a key")
    os.chmod(path, 0o600)
    with pytest.raises(KeyFileError, match="not a PEM private key"):
        load_or_create_identity(path, ALICE)


def test_a_peer_cannot_open_a_session_under_another_nodes_session_id(
    network: MockNetwork,
) -> None:
    # Carol is a genuine member, but in a three-party flow she could learn the id of the
    # session Alice will open with Bob: opening it first must not squat on it.
    alice, bob, carol = network.nodes
    handle = alice.start_flow(PingFlow(bob.party))
    alices_session = initiator_session_id(handle.flow_id, 0, identity_tag(ALICE))
    squat = carol.node.authenticator.authenticate(
        Message(message_id(alices_session, 0), SESSION_TOPIC, CAROL, initial_ping(alices_session)),
        BOB,
    )
    network.messaging.inject_raw(BOB, encode_frame(squat))  # queued before Alice's
    network.run_network()
    assert handle.result() == "Pong"
    (reason,) = dead_letter_reasons(bob)
    assert f"is not {CAROL}'s" in reason and identity_tag(CAROL) in reason
    assert bob.node.manager.statistics.flows_started == 1
    assert_drained(network)
    network.stop_nodes()
