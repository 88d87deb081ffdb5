"""Bridges to a PostgreSQL inbound over TLS, verified against the network root.

A PostgreSQL server of the test's own (``tests/tls_postgres.py``) listens with TLS only on a
certificate the network root issued for ``127.0.0.1``. Carol publishes her inbound there with
``sslmode=verify-full``; Alice's bridge adds the network root as the certificate the server's
must chain to (``TlsSettings.libpq_url``) and logs in with the peer role Carol gave her.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from flows.network.doorman import ROOT_CERTIFICATE_FILE, RootAuthority, new_tls_server_key
from messaging.bridges import BridgeManager
from messaging.peer_senders import Credentials
from messaging.tls import TlsSettings
from tests.conftest import PSYCOPG_MISSING, require_service
from tests.integration.test_bridges import FakeDirectory, FakeOutbox, row
from tests.tls_postgres import tls_postgres, tls_postgres_problem
from tests.waiting import wait_until

pytest.importorskip("psycopg", reason=PSYCOPG_MISSING)

ALICE = "O=Alice,L=London,C=GB"
CAROL = "O=Carol,L=Zurich,C=CH"
pytestmark = pytest.mark.slow


@attrs.frozen
class Server:
    """The TLS PostgreSQL server: its port and the root that trusts it."""

    port: int
    root: Path
    """The network root certificate (PEM) the server's certificate was issued by."""

    def inbound(self, host: str = "127.0.0.1") -> str:
        """Carol's inbound as she publishes it (no credentials, TLS verified)."""
        return f"postgresql://{host}:{self.port}/postgres?sslmode=verify-full"


@contextlib.contextmanager
def server_certified_by(directory: Path, hosts: list[str]) -> Iterator[Server]:
    """A TLS server whose certificate a new root (made in ``directory``) issued for ``hosts``."""
    require_service("a PostgreSQL server of the test's own", tls_postgres_problem())
    authority = RootAuthority.create(directory, "CN=Network Root,O=Test")
    key = new_tls_server_key()
    certificate = authority.issue_tls_server(key.public_key(), hosts)
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    with tls_postgres(certificate.public_bytes(Encoding.PEM), key_pem) as port:
        yield Server(port, directory / ROOT_CERTIFICATE_FILE)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with server_certified_by(tmp_path / "root", ["127.0.0.1"]) as running:
        owner = TlsSettings(trust=running.root).libpq_url(running.inbound())
        from messaging.sqlqueue import SqlQueueBroker

        broker = SqlQueueBroker(owner.replace("://", "://postgres@", 1))
        broker.create_queue(CAROL)
        broker.close()
        yield running


def bridge(tls: TlsSettings, address: str) -> tuple[BridgeManager, FakeOutbox]:
    outbox = FakeOutbox()
    manager = BridgeManager(
        outbox,
        FakeDirectory({CAROL: address}),
        ALICE,
        credentials={CAROL: Credentials("postgres", "trust-auth")},
        tls=tls.context,
        libpq_tls=tls.libpq_url,
    )
    return manager, outbox


def depth(server: Server) -> int:
    from messaging.sqlqueue import SqlQueueBroker

    owner = TlsSettings(trust=server.root).libpq_url(server.inbound())
    broker = SqlQueueBroker(owner.replace("://", "://postgres@", 1))
    try:
        return broker.depth(CAROL)
    finally:
        broker.close()


def test_a_bridge_reaches_a_postgres_inbound_over_tls_verified_by_the_root(
    server: Server,
) -> None:
    manager, outbox = bridge(TlsSettings(trust=server.root), server.inbound())
    manager.start()
    try:
        outbox.rows.update({r.message_id: r for r in (row("m1", CAROL), row("m2", CAROL))})
        manager.resend_pending()
        wait_until(manager.idle, "both rows confirmed by Carol's database", 30)
    finally:
        manager.stop()
    assert depth(server) == 2
    assert sorted(outbox.deleted) == ["m1", "m2"]


def test_the_connection_really_is_tls(server: Server) -> None:
    from sqlalchemy import text

    from foundation.engine import open_engine

    url = TlsSettings(trust=server.root).libpq_url(server.inbound())
    engine = open_engine(url.replace("://", "://postgres@", 1))
    try:
        with engine.connect() as connection:
            found = connection.execute(
                text("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            ).one()
    finally:
        engine.dispose()
    assert found == (True, "TLSv1.3")


def test_a_server_certificate_from_another_root_is_refused(server: Server, tmp_path: Path) -> None:
    RootAuthority.create(tmp_path / "other-root", "CN=Another Root,O=Elsewhere")
    trusting_another = TlsSettings(trust=tmp_path / "other-root" / ROOT_CERTIFICATE_FILE)
    manager, outbox = bridge(trusting_another, server.inbound())
    manager.start()
    try:
        outbox.rows["m1"] = row("m1", CAROL)
        manager.resend_pending()
        wait_until(
            lambda: "certificate verify failed" in manager.status()[0].state,
            "the bridge to refuse Carol's server certificate",
            30,
        )
    finally:
        manager.stop()
    assert outbox.deleted == [] and depth(server) == 0


def test_a_host_name_the_server_certificate_does_not_carry_is_refused(server: Server) -> None:
    manager, outbox = bridge(TlsSettings(trust=server.root), server.inbound("localhost"))
    manager.start()
    try:
        outbox.rows["m1"] = row("m1", CAROL)
        manager.resend_pending()
        wait_until(
            lambda: "does not match host name" in manager.status()[0].state,
            "the bridge to refuse a certificate for another host name",
            30,
        )
    finally:
        manager.stop()
    assert outbox.deleted == [] and depth(server) == 0


def test_libpq_url_adds_the_node_files_only_where_tls_is_verified() -> None:
    tls = TlsSettings(Path("/r/root.pem"), Path("/n/alice.cert.pem"), Path("/n/alice.key.pem"))
    verified = tls.libpq_url("postgresql://u:p@db.example/q?sslmode=verify-full")
    assert verified == (
        "postgresql://u:p@db.example/q?sslmode=verify-full&sslrootcert=%2Fr%2Froot.pem"
        "&sslcert=%2Fn%2Falice.cert.pem&sslkey=%2Fn%2Falice.key.pem"
    )
    own = "postgresql://db.example/q?sslmode=verify-ca&sslrootcert=%2Fmine.pem"
    assert "sslrootcert=%2Fmine.pem" in tls.libpq_url(own)
    assert "%2Fr%2Froot.pem" not in tls.libpq_url(own)
    for unchanged in (
        "postgresql://db.example/q",
        "postgresql://db/q?sslmode=require",
        "amqps://broker/v",
        "sqlite:///q.db",
    ):
        assert tls.libpq_url(unchanged) == unchanged
