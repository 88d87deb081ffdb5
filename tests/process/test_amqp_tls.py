"""Bridges and inbounds over ``amqps://``: the broker's certificate comes from the network root.

A RabbitMQ node of this test module's own (:mod:`tests.tls_broker`) listens for TLS only,
with a certificate the network root issued for ``localhost`` and with client certificates
required (``verify_peer``, ``fail_if_no_peer_cert = true``); nodes present the certificate
the root issued them, with their Ed25519 identity key. The bridge trusts the network root
only: a broker certified by anything else, or reached by a name its certificate does not
carry, is refused with the reason, and so is a client without a certificate.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from cryptography.x509.oid import ExtendedKeyUsageOID

from flows.cli.main import main
from flows.network.doorman import (
    ROOT_CERTIFICATE_FILE,
    RootAuthority,
    certificate_request,
    new_tls_server_key,
)
from flows.network.identity import load_or_create_identity
from flows.network.map import node_key
from flows.network.trust import NetworkTrustError
from messaging.tls import TlsSettings, certificate_refusal
from tests.conftest import PIKA_MISSING, require_service
from tests.tls_broker import TlsBroker, rabbitmq_server_problem

pytest.importorskip("pika", reason=PIKA_MISSING)  # before the imports that need it

from flows.party import Party
from messaging.amqp import AmqpMessaging
from messaging.bridges import BridgeManager
from messaging.peer_senders import PEER_RECONNECT_SECONDS, Credentials, open_peer_sender
from messaging.service import SESSION_TOPIC, Message, TransportError
from samples.pingpong import PingFlow
from statemachine.ports import OutboxRow
from tests.integration.test_bridges import FakeDirectory, FakeOutbox
from tests.process_cluster import NAMES, ClusterNode
from tests.waiting import wait_until

ALICE, BOB = NAMES[0], NAMES[1]


@attrs.frozen
class Pki:
    """The network root, a stranger root, the broker's files and two nodes' files."""

    directory: Path
    root: RootAuthority
    other: RootAuthority
    broker_cert: Path
    broker_key: Path

    @property
    def root_file(self) -> Path:
        """The network root certificate (what nodes trust)."""
        return self.directory / "root" / ROOT_CERTIFICATE_FILE

    @property
    def other_root_file(self) -> Path:
        """Another root's certificate (a network the broker is not part of)."""
        return self.directory / "other" / ROOT_CERTIFICATE_FILE

    def key_file(self, name: str) -> Path:
        """The node's identity key file (created on first use)."""
        path = self.directory / f"{node_key(name)}.key.pem"
        load_or_create_identity(path, name)
        return path

    def certificate(self, name: str, root: RootAuthority | None = None) -> Path:
        """A certificate for the node's name and key, from ``root`` (default: the network's)."""
        issuer = root or self.root
        suffix = "" if issuer is self.root else ".stranger"
        path = self.directory / f"{node_key(name)}{suffix}.cert.pem"
        if not path.exists():
            identity = load_or_create_identity(self.key_file(name), name)
            path.write_bytes(issuer.issue(certificate_request(identity)).public_bytes(Encoding.PEM))
        return path

    def node_tls(self, name: str) -> TlsSettings:
        """What a node of this network uses: the root, its certificate and its key."""
        return TlsSettings(self.root_file, self.certificate(name), self.key_file(name))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    root = RootAuthority.create(directory / "root", "CN=TLS Test Root,O=Fiberflow")
    other = RootAuthority.create(directory / "other", "CN=Another Network's Root")
    key = new_tls_server_key()
    broker_key = directory / "broker.key.pem"
    broker_key.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    broker_key.chmod(0o600)
    broker_cert = directory / "broker.cert.pem"
    certificate = root.issue_tls_server(key.public_key(), ["localhost"], 2)
    broker_cert.write_bytes(certificate.public_bytes(Encoding.PEM))
    return Pki(directory, root, other, broker_cert, broker_key)


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    """The TLS broker: certified by the network root for ``localhost``, client certs required."""
    require_service("a RabbitMQ node of the tests' own", rabbitmq_server_problem())
    started = TlsBroker.start(
        tmp_path_factory.mktemp("tls-broker"),
        cacertfile=pki.root_file,
        certfile=pki.broker_cert,
        keyfile=pki.broker_key,
    )
    print(f"the TLS broker {started.node} started in {started.started_in:.1f} s")
    try:
        yield started
    finally:
        started.stop()


def signed_less(message_id: str) -> Message:
    return Message(message_id, SESSION_TOPIC, ALICE, f"data of {message_id}".encode())


# --- the certificates ---------------------------------------------------------------------


def test_a_tls_server_certificate_names_each_host_and_is_for_servers_only(pki: Pki) -> None:
    key = new_tls_server_key()
    certificate = pki.root.issue_tls_server(key.public_key(), ["broker.example", "10.0.0.7"])
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["broker.example"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert certificate.issuer == pki.root.certificate.subject
    assert certificate.subject.rfc4514_string() == "CN=broker.example"


@pytest.mark.parametrize(
    ("hosts", "problem"),
    [([], "at least one host"), (["two words"], "neither an IP address nor a DNS name")],
)
def test_a_tls_server_certificate_needs_hosts_that_are_names_or_addresses(
    pki: Pki, hosts: list[str], problem: str
) -> None:
    with pytest.raises(NetworkTrustError, match=problem):
        pki.root.issue_tls_server(new_tls_server_key().public_key(), hosts)


def test_a_tls_server_certificate_may_not_outlive_the_root(pki: Pki) -> None:
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3650)
    with pytest.raises(NetworkTrustError, match="would outlive the root"):
        pki.root.issue_tls_server(new_tls_server_key().public_key(), ["x"], not_before=later)


def test_issue_tls_writes_a_new_key_and_its_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["network", "create-root", "--out", "root"]) == 0
    issue = ["network", "issue-tls", "--root-dir", "root", "--host", "127.0.0.1", "--host",
             "localhost", "--out-cert", "b.cert.pem", "--out-key", "b.key.pem"]  # fmt: skip
    assert main(issue) == 0
    assert "for 127.0.0.1, localhost" in capsys.readouterr().out
    assert stat.S_IMODE((tmp_path / "b.key.pem").stat().st_mode) == 0o600
    certificate = x509.load_pem_x509_certificate((tmp_path / "b.cert.pem").read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    key_before = (tmp_path / "b.key.pem").read_bytes()
    assert main(issue) == 2  # never overwrites a key
    assert "b.key.pem exists: refusing to overwrite a key" in capsys.readouterr().err
    assert (tmp_path / "b.key.pem").read_bytes() == key_before


def test_only_refused_certificates_count_as_refusals() -> None:
    import pika.exceptions

    lost = pika.exceptions.IncompatibleProtocolError(
        "StreamLostError: (\"Stream connection lost: SSLError(1, '[SSL: "
        "TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required (_ssl.c:2580)')\",)"
    )
    assert certificate_refusal(lost) == (
        "the broker refused this node's TLS client certificate: tlsv13 alert certificate required"
    )
    cut = ssl.SSLError(1, "[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred (_ssl.c:1006)")
    assert certificate_refusal(pika.exceptions.AMQPConnectionError(cut)) is None  # retried
    assert certificate_refusal(ConnectionRefusedError(111, "Connection refused")) is None


# --- the bridge over amqps:// ---------------------------------------------------------------


@pytest.mark.slow
def test_a_bridge_sends_over_amqps_and_the_message_arrives(pki: Pki, broker: TlsBroker) -> None:
    arrived: list[Message] = []
    lock = threading.Lock()

    def take(message: Message) -> None:
        with lock:
            arrived.append(message)
        bob.acknowledge(message)

    # Bob's inbound on the TLS broker: his own consumer connects over TLS too.
    bob = AmqpMessaging(broker.url(), BOB, tls=pki.node_tls(BOB).context)
    bob.add_handler(SESSION_TOPIC, take)
    bob.start()
    rows = [OutboxRow(f"m-{n}", BOB, f"over TLS {n}".encode()) for n in range(3)]
    outbox = FakeOutbox(rows)
    bridges = BridgeManager(
        outbox,
        FakeDirectory({BOB: f"amqps://localhost:{broker.port}/%2F"}),
        ALICE,
        credentials={"*": Credentials("guest", "guest")},
        tls=pki.node_tls(ALICE).context,
    )
    try:
        bridges.start()
        bridges.resend_pending()
        wait_until(lambda: len(arrived) == 3, "Bob to receive the three messages", 30)
        wait_until(lambda: not outbox.rows, "the outbox to empty", 30)
        assert sorted(m.data for m in arrived) == sorted(r.data for r in rows)
        # The broker saw TLS 1.3 connections presenting Alice's and Bob's certificates.
        listed = broker.ctl("list_connections", "ssl_protocol", "peer_cert_subject")
        assert f"tlsv1.3\t{ALICE}" in listed and f"tlsv1.3\t{BOB}" in listed, listed
    finally:
        bridges.stop()
        bob.stop()


@pytest.mark.slow
@pytest.mark.parametrize("trust", ["another root", "the system's trust store"])
def test_a_broker_certificate_not_issued_by_the_network_root_is_refused(
    pki: Pki, broker: TlsBroker, trust: str
) -> None:
    # A node of another network (another root), or one with no root at all, does not
    # accept the broker: its certificate chains to a root that node does not trust.
    tls = TlsSettings(
        pki.other_root_file if trust == "another root" else None,
        pki.certificate(ALICE),
        pki.key_file(ALICE),
    )
    sender = open_peer_sender(broker.url(), "test", tls.context)
    try:
        with pytest.raises(TransportError) as refused:
            sender.send_batch([(signed_less("m-1"), BOB)])
    finally:
        sender.close()
    message = str(refused.value)
    assert "the broker's certificate failed verification" in message
    assert "certificate" in message.rsplit(":", 1)[1]  # OpenSSL's reason, e.g. self-signed
    assert "guest:***" in message and "guest:guest" not in message


@pytest.mark.slow
def test_the_bridge_status_names_a_refused_broker_certificate(pki: Pki, broker: TlsBroker) -> None:
    outbox = FakeOutbox([OutboxRow("m-1", BOB, b"never sent")])
    tls = TlsSettings(pki.other_root_file, pki.certificate(ALICE), pki.key_file(ALICE))
    bridges = BridgeManager(
        outbox,
        FakeDirectory({BOB: f"amqps://localhost:{broker.port}/%2F"}),
        ALICE,
        credentials={"*": Credentials("guest", "guest")},
        tls=tls.context,
    )
    try:
        bridges.start()
        bridges.resend_pending()

        def state() -> str:
            return bridges.status()[0].state if bridges.status() else ""

        wait_until(lambda: state().startswith("unreachable"), "the bridge to be refused", 30)
        assert "certificate failed verification" in state()
        assert outbox.rows  # kept, to be sent once the broker is trusted
    finally:
        bridges.stop()


@pytest.mark.slow
def test_a_host_name_the_broker_certificate_does_not_carry_is_refused(
    pki: Pki, broker: TlsBroker
) -> None:
    # The certificate names localhost only: the same broker reached as 127.0.0.1 is refused.
    sender = open_peer_sender(broker.url("127.0.0.1"), "test", pki.node_tls(ALICE).context)
    try:
        with pytest.raises(TransportError, match="certificate failed verification: IP address"):
            sender.send_batch([(signed_less("m-1"), BOB)])
    finally:
        sender.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("client", "alert"),
    [("none", "certificate required"), ("from another root", "unknown ca")],
)
def test_a_client_certificate_the_broker_does_not_accept_is_refused(
    pki: Pki, broker: TlsBroker, client: str, alert: str
) -> None:
    if client == "none":
        tls = TlsSettings(pki.root_file)
    else:
        tls = TlsSettings(pki.root_file, pki.certificate(ALICE, pki.other), pki.key_file(ALICE))
    sender = open_peer_sender(broker.url(), "test", tls.context)
    began = time.monotonic()
    try:
        with pytest.raises(TransportError) as refused:
            sender.send_batch([(signed_less("m-1"), BOB)])
    finally:
        sender.close()
    assert time.monotonic() - began < PEER_RECONNECT_SECONDS  # at once: no reconnecting
    assert "the broker refused this node's TLS client certificate" in str(refused.value)
    assert alert in str(refused.value)


# --- node processes -------------------------------------------------------------------------


@pytest.mark.slow
def test_ping_pong_between_node_processes_with_an_inbound_on_the_tls_broker(
    pki: Pki, broker: TlsBroker, tmp_path: Path
) -> None:
    """Alice's inbound is on the TLS broker, Bob's a SQLite queue; both bridges cross."""
    inbound = {ALICE: broker.url(), BOB: f"sqlite:///{tmp_path / 'bob-queue.db'}"}
    credentials = '[bridge_credentials."*"]\nuser = "guest"\npassword = "guest"\n'
    nodes = {}
    for name in (ALICE, BOB):
        fields = {
            "topology": "p2p",
            "network_map": "network-map",
            "network_root": str(pki.root_file),
            "certificate": str(pki.certificate(name)),
            "key_file": str(pki.key_file(name)),
        }
        nodes[name] = ClusterNode(name, tmp_path, None, inbound[name], fields, credentials)
    try:
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            node.wait_started()
        bob = nodes[BOB]
        pings = bob.client.start_flows([PingFlow(Party(ALICE))])
        pings += nodes[ALICE].client.start_flows([PingFlow(Party(BOB))])
        bob.client.wait(pings[:1], 120)
        nodes[ALICE].client.wait(pings[1:], 120)
        assert bob.client.result(pings[0]) == "Pong"
        assert nodes[ALICE].client.result(pings[1]) == "Pong"
        assert "TLS trusts the root" in nodes[ALICE].log_path.read_text()
        # Alice consumes her inbound over TLS, Bob's bridge publishes there over TLS: each
        # connection presents its node's certificate (Bob's bridge keeps its connection
        # open while it is not idle for IDLE_CLOSE_SECONDS).
        listed = broker.ctl("list_connections", "ssl_protocol", "peer_cert_subject")
        assert f"tlsv1.3\t{ALICE}" in listed and f"tlsv1.3\t{BOB}" in listed, listed
    finally:
        for node in nodes.values():
            node.stop()
            node.client.close()
