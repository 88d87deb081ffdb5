"""The network trust root: certificates from the doorman, signed node-infos, a rooted map."""

from __future__ import annotations

import datetime
import json
import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from flows.config.runtime import ConfigError, config_from_mapping
from flows.network.doorman import (
    ROOT_CERTIFICATE_FILE,
    ROOT_KEY_FILE,
    RootAuthority,
    certificate_request,
)
from flows.network.identity import NetworkMapPeerKeys, NodeIdentity, StaticPeerKeys
from flows.network.map import NetworkMap, NetworkMapScan, NodeInfo
from flows.network.trust import (
    NetworkRoot,
    NetworkTrustError,
    NodeInfoRejected,
    NodeTrust,
    party_name,
    x509_name,
)
from messaging.authentication import MessageAuthenticator, MessageVerifier
from messaging.service import Message

ALICE, BOB, CAROL = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US", "O=Carol,L=Zurich,C=CH"


@pytest.fixture
def authority(tmp_path: Path) -> RootAuthority:
    return RootAuthority.create(tmp_path / "root")


@pytest.fixture
def root(authority: RootAuthority) -> NetworkRoot:
    return authority.network_root()


def pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


def issue(authority: RootAuthority, identity: NodeIdentity, **keywords: object) -> str:
    return pem(authority.issue(certificate_request(identity), **keywords))  # type: ignore[arg-type]


def signed_info(identity: NodeIdentity, certificate: str | None) -> NodeInfo:
    info = NodeInfo(identity.name, identity.name, "sqlite:///queue.db", certificate=certificate)
    return info.signed_by(identity)


# --- the root and the doorman ---------------------------------------------------------------


def test_a_root_is_a_0600_key_and_a_self_signed_ca_certificate_never_overwritten(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "root"
    authority = RootAuthority.create(directory, "CN=Test Root,O=Example Network", days=30)
    key_path, cert_path = directory / ROOT_KEY_FILE, directory / ROOT_CERTIFICATE_FILE
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
    assert certificate.subject == certificate.issuer
    assert certificate.subject.rfc4514_string() == "CN=Test Root,O=Example Network"
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    loaded = RootAuthority.load(directory)
    assert loaded.certificate == authority.certificate
    key_before = key_path.read_bytes()
    with pytest.raises(NetworkTrustError, match="exists: refusing to overwrite"):
        RootAuthority.create(directory)
    assert key_path.read_bytes() == key_before
    cert_path.unlink()  # either file present is enough to refuse
    with pytest.raises(NetworkTrustError, match="refusing to overwrite"):
        RootAuthority.create(directory)


def test_a_node_certificate_is_issued_from_its_request_and_its_node_info_verifies(
    authority: RootAuthority, root: NetworkRoot, tmp_path: Path
) -> None:
    alice = NodeIdentity.generate(ALICE)
    certificate = authority.issue(certificate_request(alice))
    assert certificate.subject.rfc4514_string() == ALICE
    assert certificate.issuer == authority.certificate.subject
    constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert not constraints.ca
    assert certificate.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature
    lifetime = certificate.not_valid_after_utc - certificate.not_valid_before_utc
    assert lifetime == datetime.timedelta(days=365)
    again = authority.issue(certificate_request(alice))
    assert again.serial_number != certificate.serial_number
    root.verify_node_info(signed_info(alice, pem(certificate)))
    loaded = NetworkRoot.load(tmp_path / "root" / ROOT_CERTIFICATE_FILE)
    loaded.verify_node_info(signed_info(alice, pem(certificate)))


def test_the_doorman_refuses_requests_it_cannot_certify(authority: RootAuthority) -> None:
    with pytest.raises(NetworkTrustError, match="not a PEM certificate request"):
        authority.issue(b"-----BEGIN CERTIFICATE REQUEST-----\nnonsense\n")
    key = Ed25519PrivateKey.generate()
    not_a_party = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name.from_rfc4514_string("CN=Mallory"))
        .sign(key, None)
    )
    with pytest.raises(NetworkTrustError, match="subject is not a node name"):
        authority.issue(not_a_party.public_bytes(serialization.Encoding.PEM))
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ec_request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name.from_rfc4514_string(ALICE))
        .sign(ec_key, hashes.SHA256())
    )
    with pytest.raises(NetworkTrustError, match="not an Ed25519 key"):
        authority.issue(ec_request.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(NetworkTrustError, match="would outlive the root"):
        authority.issue(certificate_request(NodeIdentity.generate(ALICE)), days=100_000)


# --- what a root refuses, and why --------------------------------------------------------------


def ca_certificate_from(authority: RootAuthority, identity: NodeIdentity) -> str:
    """A CA certificate for a node's name and key, signed by the root (never issued by it)."""
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name.from_rfc4514_string(identity.name))
        .issuer_name(authority.certificate.subject)
        .public_key(identity.private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(authority.key, None)
    )
    return pem(certificate)


def from_another_root(tmp_path: Path, alice: NodeIdentity, _: RootAuthority) -> NodeInfo:
    other = RootAuthority.create(tmp_path / "other", "CN=Other Root,O=Elsewhere")
    return signed_info(alice, issue(other, alice))


def from_a_namesake_root(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    impostor = RootAuthority.create(tmp_path / "namesake", ours.network_root().subject)
    return signed_info(alice, issue(impostor, alice))


def expired(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    long_ago = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    return signed_info(alice, issue(ours, alice, days=30, not_before=long_ago))


def not_yet_valid(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=2)
    return signed_info(alice, issue(ours, alice, days=30, not_before=soon))


def for_another_name(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    # Bob's certificate, for Bob's key, in a node-info claiming Alice's name.
    bob = NodeIdentity.generate(BOB)
    info = NodeInfo(ALICE, ALICE, "sqlite:///queue.db", public_key=bob.public_key_hex)
    return attrs.evolve(info, certificate=issue(ours, bob))


def with_another_key(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    # Mallory signs a node-info under Alice's name with her own key and Alice's certificate.
    mallory = NodeIdentity(ALICE, Ed25519PrivateKey.generate())
    return signed_info(mallory, issue(ours, alice))


def tampered(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    genuine = signed_info(alice, issue(ours, alice))
    return attrs.evolve(genuine, address="O=Mallory,L=London,C=GB")


def unsigned(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    info = NodeInfo(ALICE, ALICE, "sqlite:///queue.db", public_key=alice.public_key_hex)
    return attrs.evolve(info, certificate=issue(ours, alice))


def without_certificate(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    return signed_info(alice, None)


def ca_as_node(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    return signed_info(alice, ca_certificate_from(ours, alice))


def garbled_certificate(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    genuine = issue(ours, alice)
    lines = genuine.splitlines()
    lines[3] = lines[3][:10] + "AAAA" + lines[3][14:]  # inside the DER, not the base64 frame
    return signed_info(alice, "\n".join(lines) + "\n")


def not_pem(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    return signed_info(alice, "hello")


def root_as_node(tmp_path: Path, alice: NodeIdentity, ours: RootAuthority) -> NodeInfo:
    # The root's own certificate and key, posing as a node named like the root.
    root_identity = NodeIdentity(ALICE, ours.key)
    info = signed_info(root_identity, pem(ours.certificate))
    return info


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (from_another_root, r"^certificate issued by another root \(CN=Other Root"),
        (from_a_namesake_root, r"^certificate issued by another root: .* does not verify"),
        (expired, r"^certificate expired on 2020-01-31 "),
        (not_yet_valid, r"^certificate not valid before "),
        (for_another_name, rf"^certificate is for {BOB}, not {ALICE}$"),
        (with_another_key, r"^public key does not match the certificate$"),
        (tampered, r"^signature does not verify: the node-info was changed after it was signed$"),
        (unsigned, r"^not signed by the node$"),
        (without_certificate, r"^no certificate"),
        (ca_as_node, r"^the certificate is a CA certificate, not a node's$"),
        (root_as_node, r"^the certificate is the network root itself, not a node's$"),
        (not_pem, r"^the certificate is not PEM X.509"),
        (
            garbled_certificate,
            r"^(the certificate is not PEM X.509|the certificate cannot be read|"
            r"certificate issued by another root)",
        ),
    ],
)
def test_a_root_refuses_a_node_info_naming_the_problem(
    tmp_path: Path,
    authority: RootAuthority,
    root: NetworkRoot,
    make: Callable[[Path, NodeIdentity, RootAuthority], NodeInfo],
    reason: str,
) -> None:
    info = make(tmp_path, NodeIdentity.generate(ALICE), authority)
    with pytest.raises(NodeInfoRejected, match=reason) as refused:
        root.verify_node_info(info)
    assert isinstance(refused.value, ValueError)
    assert "\n" not in str(refused.value)


def test_a_certificate_is_checked_at_a_given_time(authority: RootAuthority) -> None:
    alice = NodeIdentity.generate(ALICE)
    info = signed_info(alice, issue(authority, alice, days=10))
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=11)
    authority.network_root().verify_node_info(info)
    with pytest.raises(NodeInfoRejected, match="certificate expired on"):
        authority.network_root().verify_node_info(info, now=later)


def test_a_node_info_is_signed_over_every_field_but_its_signature() -> None:
    alice = NodeIdentity.generate(ALICE)
    info = signed_info(alice, "PEM")
    document = json.loads(info.signed_bytes().split(b"\n", 1)[1])
    assert "signature" not in document
    assert set(document) == {*attrs.asdict(info)} - {"signature"} | {"node_key"}
    assert b" " not in info.signed_bytes().split(b"\n", 1)[1].replace(b"New York", b"")
    with pytest.raises(ValueError, match="cannot be signed by"):
        info.signed_by(NodeIdentity.generate(BOB))
    with pytest.raises(ValueError, match="another public key"):
        info.signed_by(NodeIdentity.generate(ALICE))
    # The agreement key is the signer's, and the signature covers it.
    assert document["agreement_key"] == alice.agreement_key_hex
    with pytest.raises(ValueError, match="another agreement key"):
        attrs.evolve(info, agreement_key="00" * 32).signed_by(alice)


# --- the network map under a root ----------------------------------------------------------


def test_a_rooted_map_returns_only_verified_nodes_and_lists_the_refused(
    tmp_path: Path, authority: RootAuthority, root: NetworkRoot, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "network-map"
    writer = NetworkMap(directory)
    alice, bob, carol = (NodeIdentity.generate(n) for n in (ALICE, BOB, CAROL))
    writer.publish(NodeInfo(ALICE, ALICE, "q", certificate=issue(authority, alice)), alice)
    bob_path = writer.publish(NodeInfo(BOB, BOB, "q", certificate=issue(authority, bob)), bob)
    document = json.loads(bob_path.read_text())
    document["address"] = "O=Mallory,L=London,C=GB"  # changed after Bob signed it
    bob_path.write_text(json.dumps(document))
    carol_path = writer.publish(
        NodeInfo(
            CAROL,
            CAROL,
            "q",
            public_key=carol.public_key_hex,
            agreement_key=carol.agreement_key_hex,
        )
    )
    garbage = directory / "0123.json"
    garbage.write_text("{not json")

    rooted = NetworkMap(directory, root)
    caplog.set_level(logging.WARNING, logger="fiberflow.network_map")
    assert set(rooted.nodes()) == {ALICE}
    assert rooted.lookup(ALICE) is not None and rooted.lookup(BOB) is None
    assert rooted.lookup(CAROL) is None and rooted.lookup("O=Dan,L=Paris,C=FR") is None
    reasons = dict(rooted.rejected())
    assert set(reasons) == {bob_path, carol_path, garbage}
    assert reasons[bob_path] == (
        f"{BOB}: signature does not verify: the node-info was changed after it was signed"
    )
    assert reasons[carol_path].startswith(f"{CAROL}: no certificate")
    assert "0123.json" not in reasons[garbage] and "Expecting" in reasons[garbage]
    # Each refused file was logged once, however often it was read.
    rooted.nodes()
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3
    assert any(str(bob_path) in line and "changed after it was signed" in line for line in logged)
    # A changed file is logged again; an unchanged one is not.
    caplog.clear()
    document["address"] = BOB
    bob_path.write_text(json.dumps(document, indent=1))  # the genuine content: accepted again
    carol_path.write_text(carol_path.read_text() + " ")
    assert set(rooted.nodes()) == {ALICE, BOB}
    assert [str(carol_path) in r.getMessage() for r in caplog.records] == [True]
    # Without a root the same directory is read as before (the garbage file raises).
    garbage.unlink()
    assert set(NetworkMap(directory).nodes()) == {ALICE, BOB, CAROL}


def test_unsigned_node_info_files_still_read(tmp_path: Path) -> None:
    directory = tmp_path / "network-map"
    directory.mkdir()
    unsigned = {
        "name": BOB,
        "node_key": NodeInfo(BOB, BOB, "q").node_key,
        "address": BOB,
        "transport": "sqlite:///queue.db",
        "public_key": "9c" * 32,
        "agreement_key": "5a" * 32,
        "platform_version": 1,
        "updated_at": "2026-11-22T19:30:00+00:00",
    }
    (directory / f"{unsigned['node_key']}.json").write_text(json.dumps(unsigned))
    info = NetworkMap(directory).lookup(BOB)
    assert info is not None and info.certificate is None and info.signature is None
    assert info.to_json() == unsigned
    path = NetworkMap(directory).publish(info)  # an unsigned publish keeps the shape
    assert set(json.loads(path.read_text())) == set(unsigned)


def test_a_node_info_without_a_usable_agreement_key_is_refused_naming_the_field(
    tmp_path: Path, authority: RootAuthority, root: NetworkRoot
) -> None:
    directory = tmp_path / "network-map"
    directory.mkdir()
    old = {  # as a fiberflow that signed each message with Ed25519 published it
        "name": BOB,
        "node_key": NodeInfo(BOB, BOB, "q").node_key,
        "address": BOB,
        "transport": "sqlite:///queue.db",
        "public_key": "9c" * 32,
        "platform_version": 1,
        "updated_at": "2026-11-22T19:30:00+00:00",
    }
    old_path = directory / f"{old['node_key']}.json"
    old_path.write_text(json.dumps(old))
    unrooted = NetworkMap(directory)
    assert unrooted.lookup(BOB) is None and unrooted.nodes() == {}
    ((path, reason),) = unrooted.rejected()
    assert path == old_path and reason.startswith(f"{BOB}: no agreement_key: ")
    keys = NetworkMapPeerKeys(unrooted)
    assert keys.agreement_key(BOB) is None and keys.public_key(BOB) is None
    assert (keys.refusal(BOB) or "").startswith(f"{BOB}: no agreement_key")
    # Not hex, or not 32 bytes: refused too.
    for bad in ("zz" * 32, "5a" * 31):
        old_path.write_text(json.dumps({**old, "agreement_key": bad}))
        ((_, reason),) = unrooted.rejected()
        assert reason == f"{BOB}: agreement_key is not 32 bytes of hex"
    # Signed and certified, but by a node that published no agreement key: refused as well.
    alice = NodeIdentity.generate(ALICE)
    certified = signed_info(alice, issue(authority, alice))
    without = attrs.evolve(certified, agreement_key=None)
    without = attrs.evolve(without, signature=alice.sign_bytes(without.signed_bytes()).hex())
    root.verify_node_info(without)  # the root has nothing against it...
    (directory / f"{without.node_key}.json").write_text(json.dumps(without.to_json()))
    rooted = NetworkMap(directory, root)
    assert rooted.lookup(ALICE) is None  # ... but no message could be authenticated
    reasons = dict(rooted.rejected())
    assert reasons[directory / f"{without.node_key}.json"].startswith(
        f"{ALICE}: no agreement_key: "
    )


def test_publish_signs_after_stamping_the_time(
    tmp_path: Path, authority: RootAuthority, root: NetworkRoot
) -> None:
    alice = NodeIdentity.generate(ALICE)
    authority_map = NetworkMap(tmp_path / "network-map", root)
    certificate = issue(authority, alice)
    path = authority_map.publish(NodeInfo(ALICE, ALICE, "q", certificate=certificate), alice)
    published = authority_map.lookup(ALICE)
    assert published is not None and published.updated_at and published.signature
    document = json.loads(path.read_text())
    document["updated_at"] = "2020-01-01T00:00:00+00:00"
    path.write_text(json.dumps(document))
    assert authority_map.lookup(ALICE) is None
    assert "changed after it was signed" in authority_map.rejected()[0][1]


def test_threads_of_one_process_publishing_at_once_each_replace_the_file_whole(
    tmp_path: Path,
) -> None:
    # Two workers of a node run as threads of one process (as the worker tests do) publish
    # the same node-info at the same moment: neither may find its draft taken by the other.
    alice = NodeIdentity.generate(ALICE)
    network_map = NetworkMap(tmp_path / "network-map")
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def publish_often() -> None:
        start.wait()
        try:
            for _ in range(300):
                network_map.publish(NodeInfo(ALICE, ALICE, "q"), alice)
        except BaseException as error:  # recorded: the thread's end must not hide it
            errors.append(error)

    threads = [threading.Thread(target=publish_often) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert network_map.lookup(ALICE) is not None
    assert [p.name for p in (tmp_path / "network-map").iterdir()] == [
        f"{NodeInfo(ALICE, ALICE, 'q').node_key}.json"
    ]  # no draft left behind


def test_peer_keys_over_a_rooted_map_know_no_node_whose_info_is_refused(
    tmp_path: Path, authority: RootAuthority, root: NetworkRoot
) -> None:
    directory = tmp_path / "network-map"
    alice, bob = NodeIdentity.generate(ALICE), NodeIdentity.generate(BOB)
    other = RootAuthority.create(tmp_path / "other", "CN=Other Root,O=Elsewhere")
    NetworkMap(directory).publish(
        NodeInfo(ALICE, ALICE, "q", certificate=issue(authority, alice)), alice
    )
    NetworkMap(directory).publish(NodeInfo(BOB, BOB, "q", certificate=issue(other, bob)), bob)
    rooted_keys = NetworkMapPeerKeys(NetworkMap(directory, root))
    assert rooted_keys.public_key(ALICE) == alice.public_key
    assert rooted_keys.public_key(BOB) is None
    assert NetworkMapPeerKeys(NetworkMap(directory)).public_key(BOB) == bob.public_key
    # So a message tagged by Bob fails authentication at a node trusting the root.
    carol = NodeIdentity.generate(CAROL)
    senders_view = StaticPeerKeys()  # what the senders know: everyone's keys
    for identity in (alice, bob, carol):
        senders_view.add(identity.name, identity.public_key, identity.agreement_key)

    def tagged(sender: NodeIdentity, message: Message, target: str) -> Message:
        return MessageAuthenticator.of(sender, senders_view).authenticate(message, target)

    verifier = MessageVerifier.of(carol, rooted_keys)
    message = tagged(bob, Message("N-s-0", "session", BOB, b"hello"), CAROL)
    refusal = rooted_keys.refusal(BOB)
    assert refusal is not None and "issued by another root" in refusal
    assert verifier.problem(message) == (
        f"unknown sender {BOB!r}: its node-info is refused: {refusal}"
    )
    genuine = tagged(alice, Message("N-s-0", "session", ALICE, b"hello"), CAROL)
    assert verifier.problem(genuine) is None
    unknown = tagged(carol, Message("N-t-0", "session", CAROL, b"x"), ALICE)
    assert MessageVerifier.of(alice, rooted_keys).problem(unknown) == (
        f"unknown sender {CAROL!r}: not in the network map"
    )


class SlowScanMap(NetworkMap):
    """A map whose every scan waits, once it has begun, until the test lets it finish."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.scanning = threading.Event()
        self.finish = threading.Event()

    def scan(self) -> NetworkMapScan:
        self.scanning.set()
        assert self.finish.wait(10)
        return super().scan()


def test_a_lookup_during_another_thread_s_first_reading_waits_for_it_and_finds_the_key(
    tmp_path: Path,
) -> None:
    # A restarted node's relay thread began the first reading of the map while a restored
    # flow looked its peer up: the flow must not be told the peer is off the map (its
    # initiate_flow would fail for good) because the reading was not finished yet.
    directory = tmp_path / "network-map"
    bob = NodeIdentity.generate(BOB)
    NetworkMap(directory).publish(NodeInfo(BOB, BOB, "q"), bob)
    slow = SlowScanMap(directory)
    keys = NetworkMapPeerKeys(slow)
    first = threading.Thread(target=keys.agreement_key, args=(BOB,))
    first.start()
    assert slow.scanning.wait(10)
    found: list[bytes | None] = []
    second = threading.Thread(target=lambda: found.append(keys.agreement_key(BOB)))
    second.start()
    second.join(0.3)
    answered_early = not second.is_alive()
    slow.finish.set()
    first.join(10)
    assert not answered_early, "the second lookup answered before the reading was complete"
    second.join(10)
    assert found == [bob.agreement_key]
    assert keys.public_key(BOB) == bob.public_key


class PublishedDuringScanMap(NetworkMap):
    """A map where a node-info is published once, just after a scan listed the directory,
    and the directory's time is set back as a coarse clock would leave it."""

    def __init__(self, directory: Path, late: Callable[[], object]) -> None:
        super().__init__(directory)
        self.late: Callable[[], object] | None = late

    def scan(self) -> NetworkMapScan:
        result = super().scan()
        if self.late is not None:
            stamp = self.directory.stat().st_mtime_ns
            self.late()
            os.utime(self.directory, ns=(stamp, stamp))  # the same tick of the clock
            self.late = None
        return result


def test_a_node_info_published_during_a_reading_in_the_same_clock_tick_is_found_at_once(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "network-map"
    alice, carol = NodeIdentity.generate(ALICE), NodeIdentity.generate(CAROL)
    NetworkMap(directory).publish(NodeInfo(ALICE, ALICE, "q"), alice)
    published = PublishedDuringScanMap(
        directory, lambda: NetworkMap(directory).publish(NodeInfo(CAROL, CAROL, "q"), carol)
    )
    keys = NetworkMapPeerKeys(published)
    assert keys.agreement_key(ALICE) == alice.agreement_key  # the reading Carol just missed
    assert published.late is None
    # Within RELOAD_SECONDS and with the directory's time unchanged, Carol's file tells.
    assert keys.agreement_key(CAROL) == carol.agreement_key
    # A name with no file does not make every lookup read the map again.
    scans: list[int] = []
    scan = published.scan
    published.scan = lambda: scans.append(1) or scan()  # type: ignore[method-assign]
    assert keys.agreement_key("O=Nobody,L=Oslo,C=NO") is None
    assert scans == []


def republished_in_the_same_tick(directory: Path, publish: Callable[[], object]) -> None:
    """``publish`` a node-info, the directory's time set back as a coarse clock leaves it."""
    stamp = directory.stat().st_mtime_ns
    publish()
    os.utime(directory, ns=(stamp, stamp))


def test_a_refused_entry_replaced_in_the_same_clock_tick_is_taken_at_the_next_lookup(
    tmp_path: Path,
) -> None:
    # Bob's entry is refused (an older fiberflow's: no agreement key); he starts with this
    # version and publishes a good one in the same tick of the directory's clock. His first
    # messages follow within milliseconds: they must not be refused for RELOAD_SECONDS.
    directory = tmp_path / "network-map"
    bob = NodeIdentity.generate(BOB)
    path = NetworkMap(directory).publish(NodeInfo(BOB, BOB, "q"), bob)
    old = json.loads(path.read_text())
    del old["agreement_key"]
    path.write_text(json.dumps(old))
    keys = NetworkMapPeerKeys(NetworkMap(directory))
    assert keys.agreement_key(BOB) is None and keys.refusal(BOB) is not None
    republished_in_the_same_tick(
        directory, lambda: NetworkMap(directory).publish(NodeInfo(BOB, BOB, "q"), bob)
    )
    assert keys.agreement_key(BOB) == bob.agreement_key and keys.refusal(BOB) is None


def test_a_key_replaced_in_the_same_clock_tick_is_read_again_when_asked(tmp_path: Path) -> None:
    directory = tmp_path / "network-map"
    bob, new_bob = NodeIdentity.generate(BOB), NodeIdentity.generate(BOB)
    NetworkMap(directory).publish(NodeInfo(BOB, BOB, "q"), bob)
    keys = NetworkMapPeerKeys(NetworkMap(directory))
    assert keys.agreement_key(BOB) == bob.agreement_key
    assert not keys.reread_if_changed(BOB)  # nothing changed: nothing read
    republished_in_the_same_tick(
        directory, lambda: NetworkMap(directory).publish(NodeInfo(BOB, BOB, "q"), new_bob)
    )
    assert keys.agreement_key(BOB) == bob.agreement_key  # known: kept until asked
    assert keys.reread_if_changed(BOB)
    assert keys.agreement_key(BOB) == new_bob.agreement_key
    assert not keys.reread_if_changed(BOB)


def test_a_map_that_cannot_be_read_keeps_the_keys_and_is_not_read_at_every_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "network-map"
    bob = NodeIdentity.generate(BOB)
    NetworkMap(directory).publish(NodeInfo(BOB, BOB, "q"), bob)
    # A file nested too deep for Python's JSON reader is refused like any unreadable one.
    (directory / ("0" * 32 + ".json")).write_text("[" * 200_000)
    network_map = NetworkMap(directory)
    ((_, reason),) = network_map.rejected()
    assert "recursion" in reason
    keys = NetworkMapPeerKeys(network_map)
    assert keys.agreement_key(BOB) == bob.agreement_key
    # Whatever else a reading raises: the keys read before stand, and the map is read again
    # when a reading is due (not at every lookup of an unknown name).
    scans: list[int] = []

    def failing_scan() -> NetworkMapScan:
        scans.append(1)
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(network_map, "scan", failing_scan)
    monkeypatch.setattr(NetworkMapPeerKeys, "REFRESH_SECONDS", 0.0)
    with caplog.at_level(logging.WARNING, logger="fiberflow.identity"):
        assert keys.agreement_key(BOB) == bob.agreement_key
    assert scans == [1] and "disk on fire" in caplog.text
    monkeypatch.setattr(NetworkMapPeerKeys, "REFRESH_SECONDS", 5.0)
    for _ in range(5):
        assert keys.agreement_key("O=Nobody,L=Oslo,C=NO") is None
        assert keys.agreement_key(BOB) == bob.agreement_key
    assert scans == [1]


def test_peer_keys_stop_trusting_a_key_whose_node_info_no_longer_verifies(
    tmp_path: Path, authority: RootAuthority, root: NetworkRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "network-map"
    alice = NodeIdentity.generate(ALICE)
    path = NetworkMap(directory).publish(
        NodeInfo(ALICE, ALICE, "q", certificate=issue(authority, alice)), alice
    )
    keys = NetworkMapPeerKeys(NetworkMap(directory, root))
    assert keys.public_key(ALICE) == alice.public_key  # known: no reading needed for a while
    document = json.loads(path.read_text())
    document["address"] = "somewhere else"  # changed after it was signed
    path.write_text(json.dumps(document))
    assert keys.public_key(ALICE) == alice.public_key  # within REFRESH_SECONDS: still cached
    monkeypatch.setattr(NetworkMapPeerKeys, "REFRESH_SECONDS", 0.0)
    assert keys.public_key(ALICE) is None
    assert "changed after it was signed" in (keys.refusal(ALICE) or "")


# --- a node's own files at start --------------------------------------------------------------


def test_a_node_loads_its_root_and_certificate_and_checks_them(
    tmp_path: Path, authority: RootAuthority
) -> None:
    alice = NodeIdentity.generate(ALICE)
    root_path = tmp_path / "root" / ROOT_CERTIFICATE_FILE
    cert_path = tmp_path / "alice.cert.pem"
    cert_path.write_text(issue(authority, alice))
    trust = NodeTrust.load(root_path, cert_path, alice)
    assert trust.root is not None and trust.certificate == cert_path.read_text()
    assert NodeTrust.load(None, cert_path, alice).root is None
    assert NodeTrust.load(None, None, alice) == NodeTrust()
    with pytest.raises(
        NetworkTrustError,
        match=rf"is not valid for the network root .*: certificate is for {ALICE}, not {BOB}",
    ):
        NodeTrust.load(root_path, cert_path, NodeIdentity.generate(BOB))
    with pytest.raises(NetworkTrustError, match="public key does not match"):
        NodeTrust.load(None, cert_path, NodeIdentity.generate(ALICE))
    with pytest.raises(NetworkTrustError, match="node certificate .*missing.pem: cannot read it"):
        NodeTrust.load(root_path, tmp_path / "missing.pem", alice)
    junk = tmp_path / "junk.pem"
    junk.write_text("junk")
    with pytest.raises(NetworkTrustError, match="network root certificate .*: not a PEM X.509"):
        NodeTrust.load(junk, cert_path, alice)
    with pytest.raises(NetworkTrustError, match="is not a CA certificate"):
        NodeTrust.load(cert_path, cert_path, alice)
    with pytest.raises(NetworkTrustError, match="needs its certificate"):
        NodeTrust.load(root_path, None, alice)


def test_the_config_takes_a_root_and_a_certificate_relative_to_its_file(tmp_path: Path) -> None:
    fields = {
        "name": ALICE,
        "database_url": "sqlite:///alice.db",
        "transport_url": "sqlite:///queue.db",
    }
    config = config_from_mapping(
        {**fields, "network_root": "root.cert.pem", "certificate": "alice.cert.pem"}, tmp_path
    )
    assert config.network_root == tmp_path / "root.cert.pem"
    assert config.certificate == tmp_path / "alice.cert.pem"
    assert config_from_mapping(fields, tmp_path).network_root is None
    with pytest.raises(
        ConfigError, match="field 'certificate': missing: required when 'network_root'"
    ):
        config_from_mapping({**fields, "network_root": "root.cert.pem"}, tmp_path)
    with pytest.raises(ConfigError, match="field 'network_root': must be a str"):
        config_from_mapping({**fields, "network_root": 3, "certificate": "c"}, tmp_path)


def test_party_names_map_to_x509_names_both_ways(
    authority: RootAuthority, root: NetworkRoot
) -> None:
    assert x509_name(ALICE) == x509.Name.from_rfc4514_string(ALICE)
    assert party_name(x509_name(BOB)) == BOB
    # Spaces after commas and characters RFC 4514 escapes are taken as the party name means.
    for name in ("O=Alice, L=London, C=GB", "O=Alice+Bob \\ Co,L=London,C=GB"):
        identity = NodeIdentity.generate(name)
        root.verify_node_info(signed_info(identity, issue(authority, identity)))
    with pytest.raises(ValueError, match="not a party name"):
        party_name(x509.Name.from_rfc4514_string("CN=Root,DC=example"))
    with pytest.raises(NetworkTrustError, match="cannot be an X.509 name"):
        certificate_request(NodeIdentity.generate("O=Alice,L=London,C=GBR"))


def test_a_node_info_published_just_after_a_reading_is_seen_at_once(tmp_path: Path) -> None:
    """A peer that joins a moment after the map was read is known at its first message, not
    a second later (its message would be dead-lettered as from an unknown sender)."""
    network_map = NetworkMap(tmp_path / "map")
    alice, bob = NodeIdentity.generate(ALICE), NodeIdentity.generate(BOB)
    network_map.publish(
        NodeInfo(ALICE, ALICE, "sqlite:///a.db", alice.public_key_hex, alice.agreement_key.hex()),
        identity=alice,
    )
    keys = NetworkMapPeerKeys(network_map)
    assert keys.agreement_key(BOB) is None  # read now: Bob has not joined
    network_map.publish(
        NodeInfo(BOB, BOB, "sqlite:///b.db", bob.public_key_hex, bob.agreement_key.hex()),
        identity=bob,
    )
    assert keys.agreement_key(BOB) == bob.agreement_key  # well within RELOAD_SECONDS
