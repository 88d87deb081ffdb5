"""The peer-to-peer relay (:mod:`messaging.bridges`) against fake peers, one bridge per peer.

The fakes stand for what a bridge talks to: the outbox (rows and deletes), the network map
(each peer's published address, changed by the test) and peers' transports (a sender per
address that takes batches or refuses them). Real transports and processes are in
``tests/process/test_p2p_network.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

from flows.network.identity import NodeIdentity, StaticPeerKeys
from messaging.authentication import MessageAuthenticator, MessageVerifier
from messaging.bridges import BridgeManager, BridgeStatus, tls_problem
from messaging.peer_senders import Credentials, public_address, with_credentials
from messaging.service import Message, TransportError
from messaging.tls import TlsContextFactory
from statemachine.ports import OutboxRow
from tests.waiting import wait_until

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"
CAROL = "O=Carol,L=Zurich,C=CH"


class FakeOutbox:
    """The outbox table: rows the node committed, and which the bridges deleted."""

    def __init__(self, rows: Sequence[OutboxRow] = ()) -> None:
        self.rows = {row.message_id: row for row in rows}
        self.deleted: list[str] = []
        self.lock = threading.Lock()

    def pending_outbox(self) -> list[OutboxRow]:
        with self.lock:
            return list(self.rows.values())

    def delete_outbox(self, message_ids: Sequence[str]) -> None:
        with self.lock:
            for message_id in message_ids:
                del self.rows[message_id]
                self.deleted.append(message_id)


class FakeDirectory:
    """The network map: peer name -> published address (None: not in the map)."""

    def __init__(self, addresses: dict[str, str]) -> None:
        self.addresses = dict(addresses)

    def address_of(self, name: str) -> str | None:
        return self.addresses.get(name)


class FakePeers:
    """Peers' transports: what each address took, which addresses refuse, what was opened."""

    def __init__(self) -> None:
        self.taken: dict[str, list[tuple[Message, str]]] = {}
        self.down: set[str] = set()
        self.opened: list[tuple[str, str]] = []
        self.closed: list[str] = []
        self.lock = threading.Lock()

    def open(self, url: str, label: str, tls: TlsContextFactory | None = None) -> FakeSender:
        with self.lock:
            self.opened.append((url, label))
        return FakeSender(self, url)

    def messages_at(self, url: str) -> list[str]:
        with self.lock:
            return [message.message_id for message, _ in self.taken.get(url, [])]


class FakeSender:
    """One connection to a peer's inbound."""

    def __init__(self, peers: FakePeers, url: str) -> None:
        self.peers = peers
        self.url = url

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        with self.peers.lock:
            if self.url in self.peers.down:
                raise TransportError(f"{self.url} refuses connections")
            self.peers.taken.setdefault(self.url, []).extend(items)

    def close(self) -> None:
        with self.peers.lock:
            self.peers.closed.append(self.url)


def row(message_id: str, target: str) -> OutboxRow:
    return OutboxRow(message_id, target, f"payload of {message_id}".encode())


@pytest.fixture
def peers() -> FakePeers:
    return FakePeers()


@pytest.fixture
def directory() -> FakeDirectory:
    return FakeDirectory({BOB: "amqp://bob-broker/bob", CAROL: "postgresql://carol-db/queue"})


@pytest.fixture
def outbox() -> FakeOutbox:
    return FakeOutbox()


@pytest.fixture
def manager(
    outbox: FakeOutbox, directory: FakeDirectory, peers: FakePeers
) -> Iterator[BridgeManager]:
    bridges = BridgeManager(outbox, directory, ALICE, open_sender=peers.open, seed=1)
    bridges.start()
    yield bridges
    bridges.stop()


def commit(outbox: FakeOutbox, manager: BridgeManager, rows: list[OutboxRow]) -> None:
    """What the node does: the rows are committed to the outbox, then handed over."""
    with outbox.lock:
        outbox.rows.update((r.message_id, r) for r in rows)
    manager.hand_off(rows)


def status_of(manager: BridgeManager, peer: str) -> BridgeStatus:
    return next(status for status in manager.status() if status.peer == peer)


def test_each_peer_gets_its_rows_at_its_address_and_rows_go_only_once_confirmed(
    manager: BridgeManager, outbox: FakeOutbox, peers: FakePeers
) -> None:
    commit(outbox, manager, [row("m1", BOB), row("m2", CAROL), row("m3", BOB)])
    wait_until(manager.idle, "every row confirmed and deleted", 30)
    assert peers.messages_at("amqp://bob-broker/bob") == ["m1", "m3"]
    assert peers.messages_at("postgresql://carol-db/queue") == ["m2"]
    assert sorted(outbox.deleted) == ["m1", "m2", "m3"]
    assert outbox.rows == {}
    sent = {(m.message_id, target, m.sender) for ms in peers.taken.values() for m, target in ms}
    assert sent == {("m1", BOB, ALICE), ("m2", CAROL, ALICE), ("m3", BOB, ALICE)}
    assert manager.handed_off == 3
    assert status_of(manager, BOB).sent == 2


def test_an_unreachable_peer_holds_back_no_other_and_loses_nothing(
    manager: BridgeManager, outbox: FakeOutbox, peers: FakePeers
) -> None:
    peers.down.add("amqp://bob-broker/bob")
    commit(outbox, manager, [row("b1", BOB), row("c1", CAROL), row("b2", BOB)])
    wait_until(lambda: "c1" in outbox.deleted, "Carol's row delivered while Bob is down", 30)
    wait_until(
        lambda: status_of(manager, BOB).state.startswith("unreachable"),
        "Bob's bridge to report him unreachable",
        30,
    )
    assert set(outbox.rows) == {"b1", "b2"}  # nothing unconfirmed was deleted
    assert status_of(manager, BOB).waiting == 2
    commit(outbox, manager, [row("c2", CAROL)])
    wait_until(lambda: "c2" in outbox.deleted, "Carol's next row too", 30)
    peers.down.clear()
    wait_until(manager.idle, "Bob's rows delivered once he is back", 30)
    assert peers.messages_at("amqp://bob-broker/bob") == ["b1", "b2"]
    assert manager.refused >= 1


def test_a_peer_not_in_the_map_keeps_its_rows_until_it_joins(
    manager: BridgeManager, outbox: FakeOutbox, peers: FakePeers, directory: FakeDirectory
) -> None:
    dave = "O=Dave,L=Oslo,C=NO"
    commit(outbox, manager, [row("d1", dave), row("b1", BOB)])
    wait_until(lambda: "b1" in outbox.deleted, "Bob's row delivered", 30)
    wait_until(
        lambda: status_of(manager, dave).state == "not in the network map",
        "Dave's bridge to say he is not in the map",
        30,
    )
    assert set(outbox.rows) == {"d1"}
    assert status_of(manager, dave) == BridgeStatus(dave, None, "not in the network map", 1, 0)
    directory.addresses[dave] = "sqlite:///dave-queue.db"
    wait_until(manager.idle, "Dave's row delivered once he joined", 30)
    assert peers.messages_at("sqlite:///dave-queue.db") == ["d1"]


def test_the_bridge_follows_a_peer_that_moved(
    manager: BridgeManager, outbox: FakeOutbox, peers: FakePeers, directory: FakeDirectory
) -> None:
    commit(outbox, manager, [row("b1", BOB)])
    wait_until(manager.idle, "the first row delivered", 30)
    directory.addresses[BOB] = "amqp://bob-new-broker/bob"
    commit(outbox, manager, [row("b2", BOB)])
    wait_until(manager.idle, "the second row delivered", 30)
    assert peers.messages_at("amqp://bob-broker/bob") == ["b1"]
    assert peers.messages_at("amqp://bob-new-broker/bob") == ["b2"]
    assert "amqp://bob-broker/bob" in peers.closed
    assert status_of(manager, BOB).address == "amqp://bob-new-broker/bob"


def test_an_idle_bridge_closes_when_its_peer_leaves(
    manager: BridgeManager, outbox: FakeOutbox, peers: FakePeers, directory: FakeDirectory
) -> None:
    commit(outbox, manager, [row("b1", BOB)])
    wait_until(manager.idle, "the row delivered", 30)
    del directory.addresses[BOB]
    wait_until(lambda: "amqp://bob-broker/bob" in peers.closed, "the connection to Bob closed", 30)


def test_a_row_that_cannot_be_prepared_is_set_aside_and_the_others_go(
    outbox: FakeOutbox, directory: FakeDirectory, peers: FakePeers
) -> None:
    class Authenticator:
        def problem(self, target: str) -> str | None:
            return None

        def authenticate(self, message: Message, target: str) -> Message:
            if message.message_id == "bad":
                raise ValueError("cannot prepare this one")
            return message

    manager = BridgeManager(
        outbox,
        directory,
        ALICE,
        authenticator=Authenticator(),  # type: ignore[arg-type]
        open_sender=peers.open,
    )
    manager.start()
    try:
        commit(outbox, manager, [row("b1", BOB), row("bad", BOB), row("b2", BOB)])
        wait_until(lambda: {"b1", "b2"} <= set(outbox.deleted), "the good rows delivered", 30)
        assert set(outbox.rows) == {"bad"}  # kept in the outbox for the next start
        assert status_of(manager, BOB).waiting == 1
        assert peers.messages_at("amqp://bob-broker/bob") == ["b1", "b2"]
    finally:
        manager.stop()


def test_rows_for_a_peer_without_a_shared_key_wait_until_there_is_one(
    outbox: FakeOutbox, directory: FakeDirectory, peers: FakePeers
) -> None:
    alice, bob, carol = (NodeIdentity.generate(name) for name in (ALICE, BOB, CAROL))
    keys = StaticPeerKeys()  # Bob's keys are known; Carol's not yet
    keys.add(BOB, bob.public_key, bob.agreement_key)
    manager = BridgeManager(
        outbox,
        directory,
        ALICE,
        authenticator=MessageAuthenticator.of(alice, keys),
        open_sender=peers.open,
    )
    manager.start()
    try:
        commit(outbox, manager, [row("b1", BOB), row("c1", CAROL)])
        wait_until(lambda: "b1" in outbox.deleted, "Bob served", 30)
        wait_until(
            lambda: "cannot authenticate" in status_of(manager, CAROL).state,
            "Carol's bridge to say why her row waits",
            30,
        )
        state = status_of(manager, CAROL).state
        assert state == (
            f"unreachable: cannot authenticate messages for {CAROL}: not in the network map"
        )
        assert set(outbox.rows) == {"c1"}
        assert [url for url, _ in peers.opened] == ["amqp://bob-broker/bob"]  # never Carol's
        ((tagged, target),) = peers.taken["amqp://bob-broker/bob"]
        assert target == BOB and MessageVerifier.of(bob, keys_of(alice)).problem(tagged) is None
        keys.add(CAROL, carol.public_key, carol.agreement_key)  # her node-info arrives
        wait_until(manager.idle, "Carol served once a key is shared with her", 30)
        ((tagged, _),) = peers.taken["postgresql://carol-db/queue"]
        assert MessageVerifier.of(carol, keys_of(alice)).problem(tagged) is None
    finally:
        manager.stop()


def keys_of(*identities: NodeIdentity) -> StaticPeerKeys:
    keys = StaticPeerKeys()
    for identity in identities:
        keys.add(identity.name, identity.public_key, identity.agreement_key)
    return keys


def test_a_start_sends_what_the_outbox_still_holds(
    directory: FakeDirectory, peers: FakePeers
) -> None:
    outbox = FakeOutbox([row("old1", BOB), row("old2", CAROL)])
    manager = BridgeManager(outbox, directory, ALICE, open_sender=peers.open)
    manager.start()
    try:
        assert manager.resend_pending() == 2
        wait_until(manager.idle, "the rows left from the last run delivered", 30)
        assert outbox.rows == {}
    finally:
        manager.stop()


def test_credentials_are_chosen_per_peer_with_a_default(
    outbox: FakeOutbox, directory: FakeDirectory, peers: FakePeers
) -> None:
    manager = BridgeManager(
        outbox,
        directory,
        ALICE,
        open_sender=peers.open,
        credentials={BOB: Credentials("alice-at-bob", "s3cret/:@"), "*": Credentials("any", "x")},
    )
    manager.start()
    try:
        commit(outbox, manager, [row("b1", BOB), row("c1", CAROL)])
        wait_until(manager.idle, "both rows delivered", 30)
    finally:
        manager.stop()
    urls = sorted(url for url, _ in peers.opened)
    assert urls == [
        "amqp://alice-at-bob:s3cret%2F%3A%40@bob-broker/bob",
        "postgresql://any:x@carol-db/queue",
    ]


@pytest.mark.parametrize(
    ("url", "published"),
    [
        (
            "amqp://guest:guest@127.0.0.1:5672/%2Fbob?declare=false",
            "amqp://127.0.0.1:5672/%2Fbob?declare=false",
        ),
        ("postgresql://postgres@db.example:5432/test", "postgresql://db.example:5432/test"),
        ("sqlite:////var/lib/bob/queue.db", "sqlite:////var/lib/bob/queue.db"),
        ("amqps://broker.example/bob", "amqps://broker.example/bob"),
    ],
)
def test_a_node_publishes_its_inbound_without_credentials(url: str, published: str) -> None:
    assert public_address(url) == published


def test_credentials_replace_whatever_the_address_carried() -> None:
    assert with_credentials("amqp://old@host/v", Credentials("u", "p")) == "amqp://u:p@host/v"
    assert with_credentials("sqlite:///q.db", Credentials("u", "p")) == "sqlite:///q.db"
    assert with_credentials("amqp://host/v", None) == "amqp://host/v"


def test_with_require_tls_a_plain_peer_gets_nothing_and_a_tls_peer_everything(
    outbox: FakeOutbox, directory: FakeDirectory, peers: FakePeers
) -> None:
    directory.addresses[BOB] = "amqps://bob-broker/bob"
    directory.addresses[CAROL] = "amqp://carol-broker/carol"
    manager = BridgeManager(outbox, directory, ALICE, open_sender=peers.open, require_tls=True)
    manager.start()
    try:
        commit(outbox, manager, [row("b1", BOB), row("c1", CAROL)])
        wait_until(lambda: "b1" in outbox.deleted, "Bob (amqps) served", 30)
        wait_until(
            lambda: "require_tls" in status_of(manager, CAROL).state,
            "Carol's bridge to refuse her plain inbound",
            30,
        )
        assert set(outbox.rows) == {"c1"}
        assert [url for url, _ in peers.opened] == ["amqps://bob-broker/bob"]  # never Carol's
        directory.addresses[CAROL] = "amqps://carol-broker/carol"  # she moves to TLS
        wait_until(manager.idle, "Carol served once her inbound is TLS", 30)
    finally:
        manager.stop()


@pytest.mark.parametrize(
    ("address", "verified"),
    [
        ("amqps://broker/v", True),
        ("amqp://broker/v", False),
        ("postgresql://db/q?sslmode=verify-full", True),
        ("postgresql://db/q?sslmode=verify-ca", True),
        ("postgresql://db/q?sslmode=require", False),
        ("postgresql://db/q", False),
        ("sqlite:////srv/q.db", True),
    ],
)
def test_which_addresses_are_tls_verified(address: str, verified: bool) -> None:
    assert (tls_problem(address) is None) == verified


def test_rows_for_a_peer_off_the_map_are_dropped_when_the_node_gives_them_up(
    manager: BridgeManager, outbox: FakeOutbox
) -> None:
    dave = "O=Dave,L=Oslo,C=NO"
    asked: list[str] = []

    def abandon(row: OutboxRow) -> str | None:
        asked.append(row.message_id)
        return "its flow has ended" if row.message_id == "d1" else None

    manager.abandon = abandon
    commit(outbox, manager, [row("d1", dave), row("d2", dave)])
    wait_until(lambda: "d1" in outbox.deleted, "d1 dropped", 30)
    wait_until(lambda: asked.count("d2") >= 2, "d2 asked about again", 30)
    assert set(outbox.rows) == {"d2"}  # kept: its flow lives
    assert status_of(manager, dave).waiting == 1
    assert manager.handed_off == 0  # a dropped row was not sent
