"""The outbox relay thread: batches, retries with backoff, deletes only what was taken."""

from __future__ import annotations

from collections.abc import Sequence

from messaging.authentication import CannotAuthenticateError
from messaging.background_relay import BackgroundOutboxRelay
from messaging.frame import MAX_FRAME_BYTES, encode_frame
from messaging.service import Message
from statemachine.ports import OutboxRow
from tests.fake_transports import TakingTransport
from tests.waiting import wait_until


class ListOutbox:
    def __init__(self, rows: list[OutboxRow]) -> None:
        self.rows = {row.message_id: row for row in rows}
        self.deleted: list[str] = []

    def pending_outbox(self) -> list[OutboxRow]:
        return list(self.rows.values())

    def delete_outbox(self, message_ids: Sequence[str]) -> None:
        for message_id in message_ids:
            del self.rows[message_id]
        self.deleted.extend(message_ids)


def wait_idle(relay: BackgroundOutboxRelay) -> None:
    wait_until(relay.idle, "the relay to become idle", 30)


def test_refused_rows_are_retried_without_holding_back_the_others() -> None:
    rows = [OutboxRow(f"m{i}", "B" if i % 3 == 0 else "A", b"x") for i in range(9)]
    transport = TakingTransport("B", refusals=6)
    outbox = ListOutbox(rows)
    relay = BackgroundOutboxRelay(transport, outbox, seed=1)
    relay.start()
    assert relay.resend_pending() == 9
    wait_idle(relay)
    relay.stop()
    assert sorted(outbox.deleted) == sorted(r.message_id for r in rows)
    assert outbox.rows == {}
    assert relay.handed_off == 9
    assert relay.refused >= 3  # the batch once, then each B row at least once
    a_rows = [r.message_id for r in rows if r.target == "A"]
    assert set(outbox.deleted[: len(a_rows)]) == set(a_rows)  # A went first, B after retries


def test_rows_not_taken_stay_in_the_outbox_after_stop() -> None:
    rows = [OutboxRow("m1", "B", b"x"), OutboxRow("m2", "A", b"y")]
    transport = TakingTransport("B", refusals=10**6)
    outbox = ListOutbox(rows)
    relay = BackgroundOutboxRelay(transport, outbox, seed=2)
    relay.start()
    relay.hand_off(rows)
    wait_until(lambda: "m2" in outbox.deleted, "the row to A to be taken", 30)
    relay.stop()
    assert list(outbox.rows) == ["m1"]
    assert not relay.idle() and relay.waiting() == 1


class FramingTransport(TakingTransport):
    """Frames every message as a real transport does (an oversized one raises)."""

    def send_batch(self, items: Sequence[tuple[Message, str]]) -> None:
        for message, _ in items:
            encode_frame(message)
        super().send_batch(items)


def test_a_row_that_cannot_be_framed_stays_in_the_outbox_and_the_relay_goes_on() -> None:
    huge = OutboxRow("huge", "A", b"x" * (MAX_FRAME_BYTES + 1))
    rows = [OutboxRow("m1", "A", b"x"), huge, OutboxRow("m2", "A", b"x")]
    transport = FramingTransport("nobody", refusals=0)
    outbox = ListOutbox(rows)
    relay = BackgroundOutboxRelay(transport, outbox, seed=1)
    relay.start()
    relay.resend_pending()
    wait_until(lambda: len(outbox.deleted) >= 2, "the sendable rows to be taken", 30)
    late = OutboxRow("m3", "A", b"x")
    outbox.rows["m3"] = late  # committed by a later round
    relay.hand_off([late])  # the thread is still alive and working
    wait_until(lambda: "m3" in outbox.deleted, "the relay thread to take a later row", 30)
    relay.stop()
    assert sorted(outbox.deleted) == ["m1", "m2", "m3"]
    assert list(outbox.rows) == ["huge"]  # kept, never lost


class OffMapAuthenticator:
    """Tags nothing; has no key for the target "Gone" (a party off the network map)."""

    def authenticate(self, message: Message, target: str) -> Message:
        if target == "Gone":
            raise CannotAuthenticateError(f"cannot authenticate messages for {target}")
        return message


def test_rows_for_a_party_off_the_map_are_kept_or_dropped_as_the_node_says() -> None:
    rows = [
        OutboxRow("m1", "A", b"x"),
        OutboxRow("g1", "Gone", b"x"),
        OutboxRow("g2", "Gone", b"x"),
    ]
    outbox = ListOutbox(rows)
    relay = BackgroundOutboxRelay(
        TakingTransport("nobody", refusals=0),
        outbox,
        seed=3,
        authenticator=OffMapAuthenticator(),  # type: ignore[arg-type]
    )
    asked: list[str] = []

    def abandon(row: OutboxRow) -> str | None:
        asked.append(row.message_id)
        return "its flow has ended" if row.message_id == "g1" else None

    relay.abandon = abandon
    relay.start()
    relay.resend_pending()
    wait_until(lambda: {"m1", "g1"} <= set(outbox.deleted), "m1 sent and g1 dropped", 30)
    wait_until(lambda: asked.count("g2") >= 2, "g2 to be tried again", 30)
    relay.stop()
    assert list(outbox.rows) == ["g2"]
    assert asked.count("g1") == 1  # dropped at its first refusal, never tried again
    assert relay.handed_off == 1 and relay.waiting() == 1
