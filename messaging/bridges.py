"""Bridges: the outbox relay of the peer-to-peer topology, one bridge per peer.

In the shared topology every node sends through one transport that all of them use. In the
peer-to-peer topology each node owns its inbound and publishes its address in the network
map; the node's outbox is then its store-and-forward queue for every peer, and a
:class:`BridgeManager` (a :class:`~messaging.relay.Relay`) forwards it:

* rows handed over after a commit are queued on the bridge of their target, created on
  demand; each bridge runs on a thread of its own, so one unreachable peer never holds back
  another;
* before each send a bridge asks the :class:`PeerDirectory` (the network map) where the peer
  is; when the address changed it closes its connection and opens one to the new address;
  when the peer is not in the map (it left, or has not joined yet) the rows stay in the
  outbox, the bridge says so in its status, and it looks again later;
* a row is deleted only after the peer's transport confirmed it (a publisher confirm, a
  committed insert); a crash in between sends it again and the peer drops the duplicate by
  its id; refusals back off with jitter (50 ms doubling to 5 s);
* a bridge with nothing to send for a while closes its connection (it reopens on demand).

Authentication is the same as in the shared topology: each message is tagged for its target
by the node's :class:`~messaging.authentication.MessageAuthenticator`. A peer the node
shares no key with yet (its node-info has no usable agreement key) is treated like an
unreachable one: its rows wait, its bridge's state and the log say why, and it looks again
with its backoff.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol
from urllib.parse import parse_qsl, urlsplit

import attrs

from messaging.authentication import CannotAuthenticateError, MessageAuthenticator
from messaging.peer_senders import Credentials, PeerSender, open_peer_sender, with_credentials
from messaging.relay import AbandonCheck, OutboxStore, ThreadedRelayBase, log_abandoned
from messaging.service import SESSION_TOPIC, Message, TransportError
from messaging.tls import TlsContextFactory
from statemachine.ports import OutboxRow

__all__ = [
    "IDLE_CLOSE_SECONDS",
    "BridgeManager",
    "BridgeStatus",
    "PeerDirectory",
    "SenderFactory",
    "tls_problem",
]

log = logging.getLogger("fiberflow.bridges")

BATCH_SIZE = 500
MIN_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 5.0
IDLE_CLOSE_SECONDS = 30.0
"""A bridge with nothing to send for this long closes its connection."""
LOOK_AGAIN_SECONDS = 1.0
"""How often an idle bridge looks whether its peer moved or left (and closes if so)."""

SenderFactory = Callable[[str, str, TlsContextFactory | None], PeerSender]
"""Opens a sender: (URL with credentials, label, TLS context factory) -> :class:`PeerSender`."""


def tls_problem(address: str) -> str | None:
    """Why ``address`` is not reached over verified TLS, or None if it is.

    ``amqps://`` is (the broker's certificate is verified); ``postgresql://`` is with
    ``sslmode=verify-full`` or ``verify-ca``; ``sqlite:///`` is a file of this host (no
    network: nothing to encrypt). Anything else is plain text between organisations.
    """
    parts = urlsplit(address)
    scheme = parts.scheme.lower()
    if scheme in ("amqps", "sqlite"):
        return None
    if scheme.startswith("postgres"):
        if dict(parse_qsl(parts.query)).get("sslmode") in ("verify-full", "verify-ca"):
            return None
        return (
            "require_tls: the peer's PostgreSQL inbound is not published with sslmode=verify-full"
        )
    return f"require_tls: the peer's inbound is {scheme}://, not TLS (amqps://)"


class PeerDirectory(Protocol):
    """Where each peer's inbound is: the network map, as bridges need it."""

    def address_of(self, name: str) -> str | None:
        """The published inbound address of node ``name``, or None if it is not in the map."""


@attrs.frozen
class BridgeStatus:
    """One bridge as an operator sees it."""

    peer: str
    address: str | None
    """The address the bridge sends to (None: the peer is not in the network map)."""
    state: str
    """``idle``, ``sending``, ``connected``, ``not in the network map``, ``unreachable: ...``."""
    waiting: int
    """Outbox rows for the peer not yet confirmed by its transport."""
    sent: int
    """Messages the peer's transport confirmed since the node started."""


class BridgeManager(ThreadedRelayBase):
    """The peer-to-peer outbox relay (see the module docstring)."""

    def __init__(
        self,
        store: OutboxStore,
        directory: PeerDirectory,
        my_address: str,
        *,
        authenticator: MessageAuthenticator | None = None,
        credentials: Mapping[str, Credentials] | None = None,
        open_sender: SenderFactory = open_peer_sender,
        seed: int | None = None,
        tls: TlsContextFactory | None = None,
        libpq_tls: Callable[[str], str] | None = None,
        require_tls: bool = False,
    ) -> None:
        """Bridges for the node at ``my_address``, forwarding ``store``'s outbox.

        ``credentials`` by peer name (``"*"``: for any peer not named) log into peers'
        transports; ``tls`` makes the TLS context of connections to ``amqps://`` peers (what
        their brokers' certificates must chain to, and this node's client certificate;
        None: the system's trust store); ``libpq_tls`` puts this node's TLS files into a
        PostgreSQL peer's URL (:meth:`~messaging.tls.TlsSettings.libpq_url`);
        ``open_sender`` opens the connections (tests give a fake). With ``require_tls``
        nothing is sent to a peer whose published address is not TLS-verified
        (:func:`tls_problem`): its rows wait, and its bridge says why.
        """
        self._store = store
        self._directory = directory
        self.my_address = my_address
        self._authenticator = authenticator
        self._credentials = dict(credentials or {})
        self._open_sender = open_sender
        self._tls = tls
        self._libpq_tls = libpq_tls
        self.require_tls = require_tls
        self._random = random.Random(seed)
        self._bridges: dict[str, _Bridge] = {}
        self._lock = threading.Lock()
        self._running = False
        self.handed_off = 0
        """Messages peers' transports confirmed (all bridges)."""
        self.refused = 0
        """Send attempts a peer's transport refused (each one is retried)."""
        self.abandon: AbandonCheck | None = None
        """Asked about the rows of a peer off the network map (see the Relay protocol)."""

    # --- the Relay protocol ---------------------------------------------------------------

    def start(self) -> None:
        """Allow bridges to run (each starts when it first has rows)."""
        with self._lock:
            self._running = True
            for bridge in self._bridges.values():
                bridge.start()

    def stop(self) -> None:
        """Stop every bridge after its batch in hand; unsent rows are sent next start."""
        with self._lock:
            self._running = False
            bridges = list(self._bridges.values())
        for bridge in bridges:
            bridge.stop()

    def hand_off(self, rows: Sequence[OutboxRow]) -> None:
        """Queue committed rows on their peers' bridges (returns at once)."""
        by_peer: dict[str, list[OutboxRow]] = collections.defaultdict(list)
        for row in rows:
            by_peer[row.target].append(row)
        for peer, peer_rows in by_peer.items():
            self._bridge(peer).add(peer_rows)

    def waiting(self) -> int:
        """Rows not yet confirmed by their peers' transports."""
        return sum(status.waiting for status in self.status())

    def idle(self) -> bool:
        """True when every row handed over was confirmed and deleted."""
        return self.waiting() == 0

    # --- for operators --------------------------------------------------------------------

    def status(self) -> list[BridgeStatus]:
        """Every bridge, by peer name."""
        with self._lock:
            bridges = sorted(self._bridges.items())
        return [bridge.status() for _, bridge in bridges]

    # --- for the bridges ------------------------------------------------------------------

    def _bridge(self, peer: str) -> _Bridge:
        with self._lock:
            bridge = self._bridges.get(peer)
            if bridge is None:
                bridge = _Bridge(self, peer)
                self._bridges[peer] = bridge
                if self._running:
                    bridge.start()
            return bridge

    def refusal(self, peer: str, address: str) -> str | None:
        """Why nothing may be sent to ``peer`` at ``address`` now, or None.

        Under this node's rules (``require_tls``), or because the node shares no key with
        the peer yet to authenticate its messages.
        """
        if self.require_tls:
            problem = tls_problem(address)
            if problem is not None:
                return problem
        if self._authenticator is not None:
            return self._authenticator.problem(peer)
        return None

    def credentials_for(self, peer: str) -> Credentials | None:
        """The credentials this node logs into ``peer``'s transport with."""
        return self._credentials.get(peer, self._credentials.get("*"))

    def address_of(self, peer: str) -> str | None:
        """Where ``peer``'s inbound is now (None: not in the network map, or unreadable)."""
        try:
            return self._directory.address_of(peer)
        except Exception as error:  # a broken map must not stop the bridge: it looks again
            log.warning("cannot look %s up in the network map: %s", peer, error)
            return None

    def open(self, address: str, peer: str) -> PeerSender:
        """A sender to ``peer``'s inbound at ``address``, logged in for this node."""
        url = with_credentials(address, self.credentials_for(peer))
        if self._libpq_tls is not None:
            url = self._libpq_tls(url)
        return self._open_sender(url, f"{self.my_address} -> {peer}", self._tls)

    def prepare(self, row: OutboxRow) -> tuple[Message, str]:
        """The authenticated transport message of an outbox row."""
        message = Message(row.message_id, SESSION_TOPIC, self.my_address, row.data)
        if self._authenticator is not None:
            message = self._authenticator.authenticate(message, row.target)
        return message, row.target

    def delete(
        self, message_ids: list[str], stopping: threading.Event, *, sent: bool = True
    ) -> bool:
        """Delete confirmed rows, retrying while the database is busy; False if given up.

        ``sent=False``: rows dropped unsent (not counted as handed off).
        """
        delay = MIN_BACKOFF_SECONDS
        while True:
            try:
                self._store.delete_outbox(message_ids)
            except Exception as error:  # the database may be busy or gone for a moment
                if stopping.is_set():
                    log.warning("outbox delete failed at stop (%s); rows resent next start", error)
                    return False
                log.warning("outbox delete failed (%s); retry in %.2f s", error, delay)
                stopping.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
                continue
            if sent:
                with self._lock:
                    self.handed_off += len(message_ids)
            return True

    def backoff(self, attempts: int) -> float:
        """The jittered delay before attempt ``attempts + 1`` (50-100 % of the backoff)."""
        with self._lock:
            self.refused += 1
            jitter = 0.5 + self._random.random() / 2
        backoff = MIN_BACKOFF_SECONDS * 2.0 ** (attempts - 1)
        return float(min(backoff, MAX_BACKOFF_SECONDS) * jitter)


class _Bridge:
    """The bridge to one peer: its rows in order, its connection, its thread."""

    def __init__(self, manager: BridgeManager, peer: str) -> None:
        self._manager = manager
        self.peer = peer
        self._rows: collections.OrderedDict[str, OutboxRow] = collections.OrderedDict()
        self._condition = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._sender: PeerSender | None = None
        self._address: str | None = None
        self._state = "idle"
        self._sent = 0
        self._attempts = 0
        self._last_activity = time.monotonic()
        self._said_missing = False
        self._set_aside: dict[str, OutboxRow] = {}
        """Rows that cannot be sent at all (framing fails): left in the outbox."""

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=f"bridge-{self.peer}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        with self._condition:
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the bridge to %s did not stop within %.0f s", self.peer, timeout)
            self._thread = None
        self._close()

    def add(self, rows: list[OutboxRow]) -> None:
        with self._condition:
            for row in rows:
                self._rows[row.message_id] = row
            self._condition.notify_all()

    def status(self) -> BridgeStatus:
        with self._condition:
            waiting = len(self._rows) + len(self._set_aside)
            return BridgeStatus(self.peer, self._address, self._state, waiting, self._sent)

    # --- the bridge's thread --------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._step()
            except Exception:  # never let the thread die: rows stay in the outbox regardless
                log.exception("bridge to %s: unexpected error; carrying on", self.peer)
                self._close()
                self._stopping.wait(MIN_BACKOFF_SECONDS)

    def _step(self) -> None:
        with self._condition:
            if not self._rows:
                self._state = "idle" if self._sender is None else "connected"
                self._condition.wait(LOOK_AGAIN_SECONDS)
            batch = list(self._rows.values())[:BATCH_SIZE]
        if not batch:
            self._look_again()
            return
        address = self._manager.address_of(self.peer)
        if address is None:
            self._peer_missing(len(batch))
            return
        self._said_missing = False
        if address != self._address:
            self._move_to(address)
        refusal = self._manager.refusal(self.peer, address)
        if refusal is not None:
            self._refused(TransportError(refusal), len(batch))
            return
        try:
            if self._sender is None:
                self._sender = self._manager.open(address, self.peer)
            self._set_state("sending")
            self._sender.send_batch([self._manager.prepare(row) for row in batch])
        except TransportError as error:
            if isinstance(error, CannotAuthenticateError):  # no key: off the network map
                self._drop_abandoned()
            self._refused(error, len(batch))
            return
        except Exception as error:  # a row that cannot be framed: find it
            log.info("bridge to %s: batch failed (%s); sending one by one", self.peer, error)
            batch = self._send_one_by_one(batch)
            if not batch:
                return
        self._confirmed(batch)

    def _send_one_by_one(self, batch: list[OutboxRow]) -> list[OutboxRow]:
        """Send rows singly; returns the rows the peer confirmed.

        A row that cannot be sent at all is set aside (kept in the outbox, sent again at the
        next start).
        """
        confirmed: list[OutboxRow] = []
        for row in batch:
            try:
                assert self._sender is not None
                self._sender.send_batch([self._manager.prepare(row)])
            except TransportError as error:
                self._confirmed(confirmed)
                self._refused(error, len(batch) - len(confirmed))
                return []
            except Exception as error:
                log.error(
                    "bridge to %s: message %s cannot be sent (%s); it stays in the outbox "
                    "and is tried again at the next start",
                    self.peer,
                    row.message_id,
                    error,
                )
                with self._condition:
                    self._rows.pop(row.message_id, None)
                    self._set_aside[row.message_id] = row
                continue
            confirmed.append(row)
        return confirmed

    def _confirmed(self, rows: list[OutboxRow]) -> None:
        """The peer's transport took ``rows``: delete them from the outbox."""
        if not rows:
            return
        self._attempts = 0
        self._last_activity = time.monotonic()
        ids = [row.message_id for row in rows]
        if self._manager.delete(ids, self._stopping):
            with self._condition:
                for message_id in ids:
                    self._rows.pop(message_id, None)
                self._sent += len(ids)

    def _look_again(self) -> None:
        """Idle: follow the peer if it moved or left, close the connection when quiet.

        A connection open to an address the peer no longer publishes is closed at once; one
        unused for :data:`IDLE_CLOSE_SECONDS` too.
        """
        address = self._manager.address_of(self.peer)
        if address != self._address:
            if self._sender is not None:
                log.info(
                    "bridge to %s: %s; closing the connection to %s",
                    self.peer,
                    "it left the network map" if address is None else f"it moved to {address}",
                    self._address,
                )
                self._close()
            with self._condition:
                self._address = address
        elif (
            self._sender is not None and time.monotonic() - self._last_activity > IDLE_CLOSE_SECONDS
        ):
            self._close()

    def _move_to(self, address: str) -> None:
        if self._address is not None:
            log.info("bridge to %s: moving from %s to %s", self.peer, self._address, address)
        self._close()
        with self._condition:
            self._address = address

    def _peer_missing(self, waiting: int) -> None:
        self._close()
        self._drop_abandoned()
        with self._condition:
            self._address = None
            self._state = "not in the network map"
            waiting = len(self._rows)
        if not self._said_missing:
            log.warning(
                "bridge to %s: the peer is not in the network map; %d message(s) kept in the "
                "outbox until it is (fiberflow node outbox lists them)",
                self.peer,
                waiting,
            )
            self._said_missing = True
        self._stopping.wait(LOOK_AGAIN_SECONDS)

    def _drop_abandoned(self) -> None:
        """Drop the rows the node no longer wants sent to this peer (off the network map)."""
        abandon = self._manager.abandon
        if abandon is None:
            return
        with self._condition:
            rows = list(self._rows.values())
        dropped = []
        for row in rows:
            reason = abandon(row)
            if reason is not None:
                log_abandoned(row, reason)
                dropped.append(row.message_id)
        if dropped and self._manager.delete(dropped, self._stopping, sent=False):
            with self._condition:
                for message_id in dropped:
                    self._rows.pop(message_id, None)

    def _refused(self, error: Exception, waiting: int) -> None:
        self._close()
        self._attempts += 1
        delay = self._manager.backoff(self._attempts)
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        self._set_state(f"unreachable: {reason}")
        if self._attempts in (1, 5) or self._attempts % 20 == 0:
            level = logging.WARNING if isinstance(error, TransportError) else logging.ERROR
            log.log(
                level,
                "bridge to %s: %d message(s) refused (attempt %d: %s); retry in %.2f s",
                self.peer,
                waiting,
                self._attempts,
                reason,
                delay,
            )
        self._stopping.wait(delay)

    def _set_state(self, state: str) -> None:
        with self._condition:
            self._state = state

    def _close(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            try:
                sender.close()
            except Exception as error:  # closing a broken connection must not stop the bridge
                log.debug("bridge to %s: closing: %s", self.peer, error)
