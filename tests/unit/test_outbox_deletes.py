"""Outbox rows the transport took are deleted by the node's next transaction, or later.

The threaded relay queues the ids of the rows the transport has durably taken
(``SqlOutbox.delete_later``); the next state machine transaction deletes them before it
commits; what no transaction takes is deleted by the relay after a while
(``delete_waiting``). A crash before that delete commits leaves the rows in the outbox: the
next start sends them again (the receiver drops the copies by id). Nothing is lost.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine.base import RootTransaction

from foundation.engine import drop_schema
from messaging.background_relay import BackgroundOutboxRelay
from persistence.pipeline import Pipeline
from persistence.store import NodeDatabase
from statemachine.actions import StoreFlowResult
from statemachine.ports import OutboxRow
from tests.fake_transports import TakingTransport
from tests.waiting import wait_until

FLOW_CLASS = "tests.cordapp.EchoFlow"


@pytest.fixture
def database(tmp_path: Path, backend: str) -> Iterator[NodeDatabase]:
    if backend == "sqlite":
        opened = NodeDatabase(f"sqlite:///{tmp_path / 'node.db'}")
        yield opened
        opened.close()
        return
    schema_name = f"ff_deletes_{uuid.uuid4().hex[:10]}"
    opened = NodeDatabase(backend, schema_name=schema_name)
    try:
        yield opened
    finally:
        opened.close()
        drop_schema(backend, schema_name)


def _write_rows(database: NodeDatabase, count: int) -> list[OutboxRow]:
    rows = [OutboxRow(f"m-{n}", "O=Peer,L=Paris,C=FR", b"frame %d" % n) for n in range(count)]
    transaction = database.checkpoints.begin()
    transaction.write_outbox([(row, 1.0) for row in rows])
    transaction.commit()
    return rows


def _commit_something(database: NodeDatabase, flow_id: str) -> None:
    transaction = database.checkpoints.begin()
    transaction.store_results([StoreFlowResult(flow_id, FLOW_CLASS, b"\x01", 2.0)])
    transaction.commit()


def test_taken_rows_ride_in_the_next_transaction(database: NodeDatabase) -> None:
    rows = _write_rows(database, 3)
    database.outbox.delete_later([rows[0].message_id, rows[2].message_id])
    assert database.count("node_outbox") == 3  # waiting for a transaction
    _commit_something(database, "flow-1")
    assert database.outbox.pending_outbox() == [rows[1]]
    assert len(database.outbox.waiting) == 0


def test_a_rolled_back_transaction_leaves_them_for_the_next(database: NodeDatabase) -> None:
    rows = _write_rows(database, 2)
    database.outbox.delete_later([row.message_id for row in rows])
    transaction = database.checkpoints.begin()
    transaction.store_results([StoreFlowResult("flow-1", FLOW_CLASS, b"\x01", 2.0)])
    transaction.rollback()
    assert database.count("node_outbox") == 2
    _commit_something(database, "flow-1")
    assert database.count("node_outbox") == 0


def test_a_failed_commit_gives_them_back(
    database: NodeDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _write_rows(database, 2)
    database.outbox.delete_later([row.message_id for row in rows])
    transaction = database.checkpoints.begin()
    transaction.store_results([StoreFlowResult("flow-1", FLOW_CLASS, b"\x01", 2.0)])

    def refuse(_: object) -> None:
        raise RuntimeError("the database went away at commit")

    with monkeypatch.context() as patched:  # the commit fails after the rows' delete was sent
        patched.setattr(RootTransaction, "commit", refuse)  # SQLite
        patched.setattr(Pipeline, "commit", refuse)  # PostgreSQL
        with pytest.raises(RuntimeError, match="went away"):
            transaction.commit()
    assert database.count("node_outbox") == 2
    assert len(database.outbox.waiting) == 2  # queued again
    assert database.outbox.delete_waiting() == 2  # by themselves, when nothing else commits
    assert database.count("node_outbox") == 0


def test_what_no_transaction_takes_is_deleted_after_a_while(database: NodeDatabase) -> None:
    rows = _write_rows(database, 2)
    database.outbox.delete_later([row.message_id for row in rows])
    assert database.outbox.delete_waiting(older_than=60.0) == 0  # not yet
    assert database.count("node_outbox") == 2
    assert database.outbox.delete_waiting(older_than=0.0) == 2
    assert database.count("node_outbox") == 0


def test_a_crash_before_the_riding_delete_commits_sends_the_rows_again(
    database: NodeDatabase,
) -> None:
    rows = _write_rows(database, 4)
    transport = TakingTransport()
    relay = BackgroundOutboxRelay(transport, database.outbox, deletes=database.outbox)
    relay.start()
    relay.hand_off(rows)
    wait_until(relay.idle, "the relay to hand every row over", 30)
    assert sorted(transport.taken) == sorted(row.message_id for row in rows)
    # The node dies here: the ids wait in memory for a transaction that never comes.
    assert database.count("node_outbox") == 4
    database.outbox.waiting.take()  # (the memory is lost with the process)
    again = TakingTransport()
    restarted = BackgroundOutboxRelay(again, database.outbox, deletes=database.outbox)
    restarted.start()
    assert restarted.resend_pending() == 4  # sent again: receivers drop the copies by id
    wait_until(restarted.idle, "the restarted relay to hand every row over", 30)
    assert sorted(again.taken) == sorted(row.message_id for row in rows)
    _commit_something(database, "flow-1")  # the node's next transaction deletes them
    assert database.count("node_outbox") == 0
    restarted.stop()
    relay.stop()


def test_a_relay_with_nothing_to_ride_on_deletes_by_itself(database: NodeDatabase) -> None:
    rows = _write_rows(database, 3)
    relay = BackgroundOutboxRelay(TakingTransport(), database.outbox, deletes=database.outbox)
    relay.start()
    relay.hand_off(rows)
    wait_until(
        lambda: database.count("node_outbox") == 0,
        "the relay to delete the rows no transaction took",
        30,
    )
    relay.stop()


def test_a_clean_stop_deletes_what_waits(database: NodeDatabase) -> None:
    rows = _write_rows(database, 2)
    relay = BackgroundOutboxRelay(TakingTransport(), database.outbox, deletes=database.outbox)
    relay.start()
    relay.hand_off(rows)
    wait_until(relay.idle, "the relay to hand every row over", 30)
    relay.stop()
    assert database.count("node_outbox") == 0
