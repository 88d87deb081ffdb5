"""A stand-in transport for relay tests: it takes messages, or refuses some for a while."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from messaging.service import Message, MessageHandler, TransportError


class TakingTransport:
    """Takes every message handed to it (durably, as far as a relay knows), recording its id.

    With ``refused_target``, messages for that target are refused (a ``TransportError``) the
    first ``refusals`` times a batch holds one.
    """

    def __init__(self, refused_target: str | None = None, refusals: int = 0) -> None:
        self.refused_target = refused_target
        self.refusals = refusals
        self.taken: list[str] = []
        self.lock = threading.Lock()

    @property
    def my_address(self) -> str:
        """The sender's name."""
        return "O=Sender,L=London,C=GB"

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""

    def add_handler(self, topic: str, callback: MessageHandler) -> None:
        """Nothing is ever received."""

    def acknowledge(self, delivered: Message) -> None:
        """Nothing is ever received."""

    def send(self, message: Message, target: str) -> None:
        """Take one message (or refuse it: see the class docstring)."""
        self.send_batch([(message, target)])

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """Take a batch, all or nothing."""
        with self.lock:
            refused = any(target == self.refused_target for _, target in items)
            if refused and self.refusals > 0:
                self.refusals -= 1
                raise TransportError(f"{self.refused_target} unreachable")
            self.taken.extend(message.message_id for message, _ in items)
