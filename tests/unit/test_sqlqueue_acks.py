"""A SQL queue consumer's acknowledgements ride in its next claim: one commit for both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event

from messaging.service import Message
from messaging.sqlqueue.broker import SqlQueueBroker
from messaging.sqlqueue.consumer import SqlQueueMessaging
from tests.waiting import wait_until

QUEUE = "O=Receiver,L=London,C=GB"


def _message(n: int) -> Message:
    return Message(f"m-{n}", "test.topic", "O=Sender,L=Paris,C=FR", b"body %d" % n)


def test_a_claim_deletes_the_acknowledged_deliveries_in_its_transaction(tmp_path: Path) -> None:
    broker = SqlQueueBroker(f"sqlite:///{tmp_path / 'queue.db'}")
    broker.create_queue(QUEUE)
    broker.enqueue([(_message(n), QUEUE) for n in range(3)])
    first = broker.claim(QUEUE, "me", 10, 60.0)
    assert len(first.rows) == 3
    broker.enqueue([(_message(n), QUEUE) for n in range(3, 5)])
    commits = []
    event.listen(broker.engine, "commit", lambda _: commits.append(1))
    done = [row_id for row_id, _ in first.rows[:2]]
    second = broker.claim(QUEUE, "me", 10, 60.0, acknowledged=done)
    assert len(second.rows) == 2 and len(commits) == 1
    assert broker.depth(QUEUE) == 3  # the third of the first claim, unacknowledged, and two
    broker.close()


def test_a_consumer_acknowledges_with_its_claims(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    consumer = SqlQueueMessaging(url, QUEUE)
    got: list[Message] = []
    consumer.add_handler("test.topic", got.append)
    sender = SqlQueueMessaging(url, "O=Sender,L=Paris,C=FR")
    transactions: list[str] = []

    def statement(_: Any, __: Any, sql: str, *___: Any) -> None:
        transactions.append(sql.split()[0].upper())

    consumer.start()
    try:
        sender.send_batch([(_message(n), QUEUE) for n in range(5)])
        wait_until(lambda: len(got) == 5, "five deliveries", 30)
        event.listen(consumer.broker.engine, "before_cursor_execute", statement)
        for message in got:
            consumer.acknowledge(message)
        sender.send_batch([(_message(5), QUEUE)])
        wait_until(lambda: len(got) == 6, "the sixth", 30)
        wait_until(lambda: consumer.broker.depth(QUEUE) == 1, "the first five deleted", 30)
        # The five were deleted in a claim's transaction: no BEGIN of a delete of its own.
        deletes = [i for i, word in enumerate(transactions) if word == "DELETE"]
        assert deletes and all(transactions[i - 1] == "BEGIN" for i in deletes)
        assert all(transactions[i + 1] == "SELECT" for i in deletes)  # the claim's query
    finally:
        consumer.stop()
        sender.stop()
