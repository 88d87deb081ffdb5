"""Waking a SQL queue's consumer in another process at once, on SQLite: a datagram per send.

PostgreSQL wakes consumers with ``NOTIFY``; SQLite has nothing like it, so a consumer would
find a message sent by another process only at its next poll. Here each consumer of a queue
in a SQLite file listens on a Unix datagram socket in Linux's abstract namespace (no file to
clean up after a crash), named after the file's real path and the queue: a sender, after its
commit, sends one empty datagram there (:func:`poke`), and the consumer's
:class:`WakeListener` sets the event its loop waits on. Nothing depends on it: a lost
datagram, a host without abstract sockets or a consumer in another network namespace only
means the message is found at the next poll, as before. A datagram carries nothing; anyone
who can send one can only make the consumer look at its queue early.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import threading

from sqlalchemy.engine import make_url

log = logging.getLogger("fiberflow.sqlqueue")

_sender: socket.socket | None = None
_sender_lock = threading.Lock()


def wake_address(url: str, queue: str) -> str | None:
    """The abstract socket name of ``queue``'s consumer in the SQLite file at ``url``.

    None for a database that is not a SQLite file (PostgreSQL wakes by ``NOTIFY``).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    if parsed.database == ":memory:":
        return None
    path = os.path.realpath(parsed.database)
    digest = hashlib.sha256(f"{path}\0{queue}".encode()).hexdigest()[:40]
    return f"\0fiberflow-sqlqueue-{digest}"


def poke(url: str, queue: str) -> None:
    """Tell ``queue``'s consumer (if it listens) that a message was committed. Never raises."""
    address = wake_address(url, queue)
    if address is None:
        return
    global _sender
    with _sender_lock:
        try:
            if _sender is None:
                _sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                _sender.setblocking(False)
            _sender.sendto(b"", address)
        except OSError:  # nobody listens, its buffer is full, or no abstract sockets here
            pass


class WakeListener:
    """Sets ``event`` whenever a datagram arrives for a queue's consumer (its own thread)."""

    def __init__(self, url: str, queue: str, event: threading.Event) -> None:
        """Listen for ``queue`` of the SQLite file at ``url``; :meth:`start` binds."""
        self._address = wake_address(url, queue)
        self._queue = queue
        self._event = event
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def listening(self) -> bool:
        """True once bound (senders in other processes can wake the consumer)."""
        return self._socket is not None

    def start(self) -> None:
        """Bind and start the listening thread; without abstract sockets, do nothing."""
        if self._address is None or self._socket is not None:
            return
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            listener.bind(self._address)
        except OSError as error:  # another consumer of the queue listens, or not Linux
            listener.close()
            log.debug("%s: no wake-up socket (%s); polling only", self._queue, error)
            return
        self._socket = listener
        self._thread = threading.Thread(
            target=self._listen, name=f"sqlqueue-wake-{self._queue}", daemon=True
        )
        self._thread.start()

    def _listen(self) -> None:
        listener = self._socket
        while listener is not None and self._socket is listener:
            try:
                listener.recv(1)
            except OSError:  # closed by stop()
                return
            if self._socket is listener:  # (not the end of a stop)
                self._event.set()

    def stop(self) -> None:
        """Stop listening (the name is free again)."""
        listener, self._socket = self._socket, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
