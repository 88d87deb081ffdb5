"""Per-peer-pair message keys: derivation, direction, and the cache following the network map."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import attrs
import msgpack
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flows.network.doorman import RootAuthority, certificate_request
from flows.network.identity import NetworkMapPeerKeys, NodeIdentity, StaticPeerKeys
from flows.network.map import NetworkMap, NodeInfo
from messaging.authentication import (
    CannotAuthenticateError,
    MessageAuthenticator,
    MessageVerifier,
)
from messaging.frame import MalformedFrameError, decode_frame
from messaging.pair_keys import PairKeyCache, derive_agreement_key
from messaging.service import Message, TransportError

ALICE, BOB, CAROL = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US", "O=Carol,L=Zurich,C=CH"


def keys_of(*identities: NodeIdentity) -> StaticPeerKeys:
    keys = StaticPeerKeys()
    for identity in identities:
        keys.add(identity.name, identity.public_key, identity.agreement_key)
    return keys


def hello(sender: str, message_id: str = "N-s-0") -> Message:
    return Message(message_id, "platform.session", sender, b"hello")


@pytest.fixture
def nodes() -> tuple[NodeIdentity, NodeIdentity, NodeIdentity]:
    return NodeIdentity.generate(ALICE), NodeIdentity.generate(BOB), NodeIdentity.generate(CAROL)


# --- derivation ------------------------------------------------------------------------------


def test_the_agreement_key_is_derived_from_the_identity_key_and_nothing_else() -> None:
    key = Ed25519PrivateKey.generate()
    first, again = NodeIdentity(ALICE, key), NodeIdentity(BOB, key)
    assert first.agreement_key == again.agreement_key  # same key file, same agreement key
    assert len(first.agreement_key) == 32 and first.agreement_key != first.public_key
    assert NodeIdentity(ALICE, Ed25519PrivateKey.generate()).agreement_key != first.agreement_key
    # The formula, written out: HKDF-SHA256 of the raw Ed25519 private bytes, its own label.
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    seed = HKDF(hashes.SHA256(), 32, salt=None, info=b"fiberflow-x25519-v1").derive(raw)
    expected = X25519PrivateKey.from_private_bytes(seed).public_key()
    assert first.agreement_key == expected.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert derive_agreement_key(key).private_bytes_raw() == seed


def test_both_ends_derive_the_same_key_for_each_direction_and_the_directions_differ(
    nodes: tuple[NodeIdentity, NodeIdentity, NodeIdentity],
) -> None:
    alice, bob, carol = nodes
    keys = keys_of(alice, bob, carol)
    at_alice, at_bob, at_carol = (PairKeyCache(n, keys) for n in nodes)
    alice_bob, bob_alice = at_alice.lookup(BOB), at_bob.lookup(ALICE)
    assert alice_bob is not None and bob_alice is not None
    assert alice_bob.sending == bob_alice.receiving  # K(A->B), computed at each end
    assert alice_bob.receiving == bob_alice.sending  # K(B->A)
    assert alice_bob.sending != alice_bob.receiving  # K(A->B) != K(B->A)
    assert len(alice_bob.sending) == 32
    # Another node's keys differ: K(A->C), K(C->B) are neither of them.
    alice_carol, carol_bob = at_alice.lookup(CAROL), at_carol.lookup(BOB)
    assert alice_carol is not None and carol_bob is not None
    others = {alice_carol.sending, alice_carol.receiving, carol_bob.sending, carol_bob.receiving}
    assert not others & {alice_bob.sending, alice_bob.receiving}


def test_the_directional_key_is_the_documented_hkdf(
    nodes: tuple[NodeIdentity, NodeIdentity, NodeIdentity],
) -> None:
    alice, bob, _ = nodes
    pair = PairKeyCache(alice, keys_of(bob)).lookup(BOB)
    assert pair is not None
    shared = alice.agreement_private_key.exchange(
        X25519PublicKey.from_public_bytes(bob.agreement_key)
    )
    info = b"".join(
        struct.pack(">I", len(part)) + part
        for part in (ALICE.encode(), alice.agreement_key, BOB.encode(), bob.agreement_key)
    )
    expected = HKDF(hashes.SHA256(), 32, salt=b"fiberflow-message-mac-v1", info=info)
    assert pair.sending == expected.derive(shared)


def test_a_changed_agreement_key_changes_the_pair_key_and_an_unchanged_one_is_reused(
    nodes: tuple[NodeIdentity, NodeIdentity, NodeIdentity],
) -> None:
    alice, bob, _ = nodes
    keys = keys_of(alice, bob)
    cache = PairKeyCache(alice, keys)
    first = cache.lookup(BOB)
    assert first is not None and cache.lookup(BOB) is first and cache.computed == 1
    bob_again = NodeIdentity.generate(BOB)  # Bob comes back with a new key file
    keys.add(BOB, bob_again.public_key, bob_again.agreement_key)
    second = cache.lookup(BOB)
    assert second is not None and cache.computed == 2
    assert second.peer_agreement_key == bob_again.agreement_key
    assert second.sending != first.sending and second.receiving != first.receiving


def test_an_agreement_key_with_no_shared_secret_is_unusable_with_the_reason(
    nodes: tuple[NodeIdentity, NodeIdentity, NodeIdentity],
) -> None:
    alice, bob, _ = nodes
    keys = keys_of(alice)
    keys.add(BOB, bob.public_key, bytes(32))  # a low-order point: the secret would be zeros
    cache = PairKeyCache(alice, keys)
    assert cache.lookup(BOB) is None and cache.lookup(BOB) is None
    assert cache.unknown_reason(BOB).startswith("its agreement_key cannot be used: no shared")
    assert MessageAuthenticator(cache).problem(BOB) == (
        f"cannot authenticate messages for {BOB}: {cache.unknown_reason(BOB)}"
    )
    keys.add(BOB, bob.public_key, bob.agreement_key)  # a good key again: usable at once
    assert cache.lookup(BOB) is not None and cache.unknown_reason(BOB) == "not in the network map"


# --- tags ------------------------------------------------------------------------------------


def test_a_tag_checks_only_at_its_target_and_only_as_from_its_sender(
    nodes: tuple[NodeIdentity, NodeIdentity, NodeIdentity],
) -> None:
    alice, bob, carol = nodes
    keys = keys_of(alice, bob, carol)
    tagged = MessageAuthenticator.of(alice, keys).authenticate(hello(ALICE), BOB)
    assert len(tagged.tag) == 32
    assert MessageVerifier.of(bob, keys).problem(tagged) is None
    assert "bad tag" in (MessageVerifier.of(carol, keys).problem(tagged) or "")  # replayed
    # Reflected: Alice's message to Bob, handed back to Alice as if Bob had sent it.
    reflected = Message(tagged.message_id, tagged.topic, BOB, tagged.data, tagged.tag)
    assert "bad tag" in (MessageVerifier.of(alice, keys).problem(reflected) or "")
    # Carol, a member, cannot pass a message off as Alice's: her keys are not Alice's.
    posing = MessageAuthenticator.of(carol, keys).authenticate(hello(ALICE), BOB)
    assert "bad tag" in (MessageVerifier.of(bob, keys).problem(posing) or "")
    # Nor can Bob's verifier be fooled by a tag of the right length that is not the tag.
    wrong = Message(tagged.message_id, tagged.topic, ALICE, tagged.data, bytes(32))
    assert "bad tag" in (MessageVerifier.of(bob, keys).problem(wrong) or "")


def test_no_tag_can_be_made_for_a_target_without_a_shared_key(
    nodes: tuple[NodeIdentity, NodeIdentity, NodeIdentity],
) -> None:
    alice, _, _ = nodes
    authenticator = MessageAuthenticator.of(alice, keys_of(alice))
    with pytest.raises(CannotAuthenticateError, match=f"for {BOB}: not in the network map"):
        authenticator.authenticate(hello(ALICE), BOB)
    assert issubclass(CannotAuthenticateError, TransportError)  # the relays retry it


def test_a_frame_of_the_signing_era_is_refused_saying_so() -> None:
    old = msgpack.packb([1, "N-s-0", "platform.session", ALICE, b"x", b"\x01" * 64])
    with pytest.raises(MalformedFrameError, match="frame version 1 .*Ed25519.* no longer accepted"):
        decode_frame(old)
    with pytest.raises(MalformedFrameError, match="unknown frame version 7"):
        decode_frame(msgpack.packb([7, "N-s-0", "platform.session", ALICE, b"x", b""]))


# --- the cache over the network map ------------------------------------------------------------


@pytest.fixture
def authority(tmp_path: Path) -> RootAuthority:
    return RootAuthority.create(tmp_path / "root", "CN=Test Root,O=Fiberflow Tests")


def publish(directory: Path, authority: RootAuthority, identity: NodeIdentity) -> Path:
    pem = authority.issue(certificate_request(identity)).public_bytes(serialization.Encoding.PEM)
    info = NodeInfo(identity.name, identity.name, "q", certificate=pem.decode())
    return NetworkMap(directory).publish(info, identity)


def test_the_pair_key_follows_the_peer_s_node_info_changed_refused_and_back(
    tmp_path: Path, authority: RootAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "network-map"
    alice, bob = NodeIdentity.generate(ALICE), NodeIdentity.generate(BOB)
    publish(directory, authority, alice)
    bob_path = publish(directory, authority, bob)
    root = authority.network_root()
    at_alice = PairKeyCache(alice, NetworkMapPeerKeys(NetworkMap(directory, root)))
    verifier = MessageVerifier(at_alice)
    bobs_view = keys_of(alice)

    def from_bob(identity: NodeIdentity, message_id: str) -> Message:
        return MessageAuthenticator.of(identity, bobs_view).authenticate(
            hello(BOB, message_id), ALICE
        )

    assert verifier.problem(from_bob(bob, "N-a-0")) is None and at_alice.computed == 1
    assert verifier.problem(from_bob(bob, "N-a-1")) is None and at_alice.computed == 1
    # Bob's node-info is changed after he signed it: within REFRESH_SECONDS nothing changes...
    genuine = bob_path.read_text()
    bob_path.write_text(json.dumps({**json.loads(genuine), "address": "elsewhere"}))
    assert verifier.problem(from_bob(bob, "N-b-0")) is None
    # ... and at the next reading Bob is refused, with the reason, both ways.
    monkeypatch.setattr(NetworkMapPeerKeys, "REFRESH_SECONDS", 0.0)
    problem = verifier.problem(from_bob(bob, "N-b-1")) or ""
    assert problem.startswith(f"unknown sender {BOB!r}: its node-info is refused: {BOB}: ")
    assert "changed after it was signed" in problem
    assert "its node-info is refused" in (MessageAuthenticator(at_alice).problem(BOB) or "")
    # The genuine node-info back: accepted again, with the same keys (nothing recomputed).
    bob_path.write_text(genuine)
    assert verifier.problem(from_bob(bob, "N-c-0")) is None and at_alice.computed == 1
    # Bob starts again with a new key: his new node-info gives a new pair key; tags made
    # with his old key fail from then on.
    new_bob = NodeIdentity.generate(BOB)
    publish(directory, authority, new_bob)
    assert verifier.problem(from_bob(new_bob, "N-d-0")) is None and at_alice.computed == 2
    assert "bad tag" in (verifier.problem(from_bob(bob, "N-d-1")) or "")


def test_a_peer_s_new_key_is_followed_at_its_first_message_and_a_bad_tag_alone_reads_nothing(
    tmp_path: Path, authority: RootAuthority
) -> None:
    directory = tmp_path / "network-map"
    alice, bob = NodeIdentity.generate(ALICE), NodeIdentity.generate(BOB)
    publish(directory, authority, alice)
    publish(directory, authority, bob)
    network_map = NetworkMap(directory, authority.network_root())
    scans: list[int] = []
    scan = network_map.scan
    network_map.scan = lambda: scans.append(1) or scan()  # type: ignore[method-assign]
    verifier = MessageVerifier.of(alice, NetworkMapPeerKeys(network_map))
    bobs_view = keys_of(alice)

    def from_bob(identity: NodeIdentity, message_id: str) -> Message:
        return MessageAuthenticator.of(identity, bobs_view).authenticate(
            hello(BOB, message_id), ALICE
        )

    assert verifier.problem(from_bob(bob, "N-a-0")) is None and len(scans) == 1
    # Forged tags, the map unchanged: refused, and the map is not read again for them.
    forged = [attrs.evolve(from_bob(bob, f"N-f-{n}"), tag=bytes(32)) for n in range(3)]
    assert all("bad tag" in (verifier.problem(message) or "") for message in forged)
    assert len(scans) == 1
    # Bob starts with a new key file and publishes his new node-info: his first message,
    # tagged with the new pair key, passes at once (not after REFRESH_SECONDS).
    new_bob = NodeIdentity.generate(BOB)
    publish(directory, authority, new_bob)
    assert verifier.problem(from_bob(new_bob, "N-b-0")) is None and len(scans) == 2
    assert "bad tag" in (verifier.problem(from_bob(bob, "N-b-1")) or "")  # the old key: no more
    assert len(scans) == 2


def test_a_peer_whose_node_info_has_no_agreement_key_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "network-map"
    alice, bob = NodeIdentity.generate(ALICE), NodeIdentity.generate(BOB)
    NetworkMap(directory).publish(NodeInfo(ALICE, ALICE, "q"), alice)
    NetworkMap(directory).publish(NodeInfo(BOB, BOB, "q", public_key=bob.public_key_hex))
    at_alice = PairKeyCache(alice, NetworkMapPeerKeys(NetworkMap(directory)))
    message = MessageAuthenticator.of(bob, keys_of(alice)).authenticate(hello(BOB), ALICE)
    problem = MessageVerifier(at_alice).problem(message) or ""
    assert problem.startswith(
        f"unknown sender {BOB!r}: its node-info is refused: {BOB}: no agreement_key: "
    )
    with pytest.raises(CannotAuthenticateError, match=f"{BOB}: no agreement_key"):
        MessageAuthenticator(at_alice).authenticate(hello(ALICE), BOB)
