"""An in-memory network: a deterministic TEST DOUBLE of a durable transport.

One :class:`InMemoryNetwork` plays the broker for every node of a test. It holds each node's
queue outside the node, so a node that "crashes" (``stop``) loses nothing the network took:
delivered but unacknowledged messages go back to the queue and are delivered again.

Nothing happens by itself: tests (or ``MockNetwork.run_network``) pump it with
:meth:`InMemoryNetwork.deliver`. Faults are injected from a seeded ``random.Random``, so a
failing schedule reproduces from its seed:

* ``drop``: ``send`` refuses the message (``TransportError``) before taking it, so the
  sender's outbox keeps it and retries;
* ``duplicate``: the message is queued twice;
* ``delay``: the message is held back for a few deliveries;
* ``reorder``: a delivery takes a random queued message instead of the oldest.

Like the durable transports, it carries frames (:mod:`messaging.frame`): a frame that does
not decode (see :meth:`InMemoryNetwork.inject_raw`), a body over the frame limit (refused on
its length before decoding; only its first ``limits.DEAD_LETTER_PREFIX_BYTES`` are kept) and a
message whose topic the receiving endpoint has no handler for are dead-lettered with the
reason, never delivered.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

import attrs

from foundation.bounded import bounded_reason
from messaging.frame import (
    MAX_FRAME_BYTES,
    MalformedFrameError,
    decode_frame,
    encode_frame,
    oversized_problem,
)
from messaging.service import Message, MessageHandler, TransportError
from statemachine.limits import DEAD_LETTER_PREFIX_BYTES


@attrs.frozen
class Faults:
    """Probabilities (0..1) of each injected fault, per message."""

    drop: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    reorder: float = 0.0
    max_delay_steps: int = 5

    def __attrs_post_init__(self) -> None:
        for name in ("drop", "duplicate", "delay", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"fault probability {name} must be in [0, 1], got {value}")
        if self.drop >= 1.0:
            raise ValueError("drop=1.0 would refuse every message forever")


@attrs.define
class _Queue:
    ready: deque[bytes] = attrs.field(factory=deque)
    delayed: list[tuple[int, bytes]] = attrs.field(factory=list)
    in_flight: dict[int, bytes] = attrs.field(factory=dict)
    """Delivered, unacknowledged frames by receipt (one per delivery: copies are separate)."""


@attrs.define
class NetworkStatistics:
    """What the network did (tests assert on these)."""

    sent: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0
    reordered: int = 0
    delivered: int = 0
    redelivered: int = 0
    dead_lettered: int = 0


@attrs.frozen
class DeadLetter:
    """A frame the network could not deliver, and why."""

    address: str
    raw: bytes
    reason: str


class InMemoryNetwork:
    """The broker of an in-memory test network."""

    def __init__(
        self, seed: int = 0, faults: Faults | None = None, max_frame_bytes: int = MAX_FRAME_BYTES
    ) -> None:
        self.random = random.Random(seed)
        self.max_frame_bytes = max_frame_bytes
        """The largest frame a node of this network takes (larger ones are dead-lettered)."""
        self.faults = faults or Faults()
        self.statistics = NetworkStatistics()
        self._queues: dict[str, _Queue] = {}
        self._endpoints: dict[str, InMemoryMessaging] = {}
        self._step = 0
        self._receipts = 0
        self.dead_letters: list[DeadLetter] = []
        """Frames that could not be delivered, in the order they were found."""

    def endpoint(self, address: str) -> InMemoryMessaging:
        """A node's messaging service on this network (a new one after each node restart)."""
        self._queues.setdefault(address, _Queue())
        endpoint = InMemoryMessaging(self, address)
        self._endpoints[address] = endpoint
        return endpoint

    def queued(self, address: str) -> list[Message]:
        """The messages ready for ``address``, decoded (tests look at what travels)."""
        found = []
        for raw in self._queues[address].ready:
            try:
                found.append(decode_frame(raw))
            except MalformedFrameError:
                continue
        return found

    def inject_raw(self, target: str, raw: bytes) -> None:
        """Queue raw bytes for ``target`` as if a broken or hostile sender had sent them."""
        self._queues[target].ready.append(raw)

    def _accept(self, message: Message, target: str) -> None:
        frame = encode_frame(message)
        queue = self._queues.get(target)
        if queue is None:
            raise TransportError(f"no node {target!r} on this network")
        if self.random.random() < self.faults.drop:
            self.statistics.dropped += 1
            raise TransportError(f"injected fault: {message.message_id} dropped before hand-off")
        self.statistics.sent += 1
        copies = 1
        if self.random.random() < self.faults.duplicate:
            self.statistics.duplicated += 1
            copies = 2
        for _ in range(copies):
            if self.random.random() < self.faults.delay:
                self.statistics.delayed += 1
                release = self._step + self.random.randint(1, self.faults.max_delay_steps)
                queue.delayed.append((release, frame))
            else:
                queue.ready.append(frame)

    def _release_delayed(self, queue: _Queue, everything: bool) -> None:
        still: list[tuple[int, bytes]] = []
        for release, message in queue.delayed:
            if everything or release <= self._step:
                queue.ready.append(message)
            else:
                still.append((release, message))
        queue.delayed = still

    def deliver(self, address: str, limit: int | None = None) -> int:
        """Deliver up to ``limit`` queued messages to ``address``'s handler; returns how many."""
        self._step += 1
        queue = self._queues[address]
        endpoint = self._endpoints.get(address)
        if endpoint is None or not endpoint.running:
            return 0
        self._release_delayed(queue, everything=False)
        delivered = 0
        while queue.ready and (limit is None or delivered < limit):
            index = 0
            if len(queue.ready) > 1 and self.random.random() < self.faults.reorder:
                index = self.random.randrange(len(queue.ready))
                self.statistics.reordered += 1
            if self._hand_over(address, endpoint, index):
                delivered += 1
        return delivered

    # --- choices made by a test (the deterministic simulation) -----------------------------

    def deliver_one(self, address: str, choice: int) -> bool:
        """Deliver the ready message ``choice`` (modulo how many are ready) to ``address``.

        With a choice other than 0 this reorders. False if nothing was ready (or the node is
        down).
        """
        queue = self._queues[address]
        endpoint = self._endpoints.get(address)
        if endpoint is None or not endpoint.running or not queue.ready:
            return False
        index = choice % len(queue.ready)
        if index:
            self.statistics.reordered += 1
        return self._hand_over(address, endpoint, index)

    def duplicate_one(self, address: str, choice: int) -> bool:
        """Queue a second copy of the ready message ``choice`` (modulo the count)."""
        queue = self._queues[address]
        if not queue.ready:
            return False
        queue.ready.append(queue.ready[choice % len(queue.ready)])
        self.statistics.duplicated += 1
        return True

    def delay_one(self, address: str, choice: int, steps: int) -> bool:
        """Hold the ready message ``choice`` (modulo the count) back for ``steps`` steps."""
        queue = self._queues[address]
        if not queue.ready:
            return False
        index = choice % len(queue.ready)
        raw = queue.ready[index]
        del queue.ready[index]
        queue.delayed.append((self._step + max(1, steps), raw))
        self.statistics.delayed += 1
        return True

    def _hand_over(self, address: str, endpoint: InMemoryMessaging, index: int) -> bool:
        queue = self._queues[address]
        raw = queue.ready[index]
        del queue.ready[index]
        if len(raw) > self.max_frame_bytes:  # refused on its length, before decoding
            kept = raw[:DEAD_LETTER_PREFIX_BYTES]
            reason = f"{oversized_problem(len(raw), self.max_frame_bytes)}; "
            self._dead_letter(address, kept, f"{reason}only its first {len(kept)} bytes are kept")
            return False
        receipt = self._receipts + 1
        try:
            message = decode_frame(raw, self.max_frame_bytes, receipt)
        except MalformedFrameError as error:
            self._dead_letter(address, raw, str(error))
            return False
        if not endpoint.handles(message.topic):
            self._dead_letter(address, raw, f"no handler for topic {message.topic!r} at {address}")
            return False
        self._receipts = receipt
        queue.in_flight[receipt] = raw
        self.statistics.delivered += 1
        endpoint._dispatch(message)
        return True

    def _dead_letter(self, address: str, raw: bytes, reason: str) -> None:
        self.dead_letters.append(DeadLetter(address, raw, bounded_reason(reason)))
        self.statistics.dead_lettered += 1

    def flush_delayed(self) -> bool:
        """Make every held-back message deliverable now; True if there were any."""
        found = False
        for queue in self._queues.values():
            if queue.delayed:
                found = True
                self._release_delayed(queue, everything=True)
        return found

    def pending(self, address: str) -> int:
        """Messages queued (ready or delayed) for ``address``, not counting those in flight."""
        queue = self._queues[address]
        return len(queue.ready) + len(queue.delayed)

    def in_flight(self, address: str) -> int:
        """Messages delivered to ``address`` and not yet acknowledged."""
        return len(self._queues[address].in_flight)

    def _acknowledge(self, address: str, delivered: Message) -> None:
        if not isinstance(delivered.receipt, int):
            raise ValueError(f"{delivered.message_id} was not delivered by this network")
        self._queues[address].in_flight.pop(delivered.receipt, None)

    def _consumer_stopped(self, address: str) -> None:
        queue = self._queues[address]
        unacknowledged = list(queue.in_flight.values())
        self.statistics.redelivered += len(unacknowledged)
        queue.ready.extendleft(reversed(unacknowledged))
        queue.in_flight = {}


class InMemoryMessaging:
    """A node's ``MessagingService`` on an :class:`InMemoryNetwork` (test double)."""

    def __init__(self, network: InMemoryNetwork, address: str) -> None:
        self._network = network
        self._address = address
        self._handlers: dict[str, MessageHandler] = {}
        self.running = False

    @property
    def my_address(self) -> str:
        """The address of this node."""
        return self._address

    @property
    def consumer_id(self) -> str:
        """The endpoint's address (the test network has one consumer per address)."""
        return self._address

    def release_deliveries_of(self, consumer_ids: Sequence[str]) -> None:
        """Nothing to do: a stopped endpoint's deliveries went back to its queue at once."""

    def start(self) -> None:
        """Start receiving deliveries."""
        self.running = True

    def stop(self) -> None:
        """Stop receiving; everything unacknowledged goes back to the queue."""
        self.running = False
        self._network._consumer_stopped(self._address)

    def add_handler(self, topic: str, callback: MessageHandler) -> None:
        """Deliver ``topic`` messages to ``callback``."""
        if topic in self._handlers:
            raise ValueError(f"a handler for topic {topic!r} is already registered")
        self._handlers[topic] = callback

    def send(self, message: Message, target: str) -> None:
        """Queue ``message`` on ``target``'s queue (or raise TransportError: injected drop)."""
        self._network._accept(message, target)

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        """Send each pair in turn (an injected drop raises part-way: resend is safe)."""
        for message, target in items:
            self._network._accept(message, target)

    def acknowledge(self, delivered: Message) -> None:
        """Remove this delivery (only this copy) from the in-flight set."""
        self._network._acknowledge(self._address, delivered)

    def handles(self, topic: str) -> bool:
        """True if a handler is registered for ``topic``."""
        return topic in self._handlers

    def _dispatch(self, message: Message) -> None:
        self._handlers[message.topic](message)
