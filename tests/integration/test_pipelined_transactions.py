"""On PostgreSQL a state machine transaction costs a fixed few round trips, not one a write.

The lease check is waited for; the writes are then queued in psycopg's pipeline mode and
``COMMIT`` follows them (persistence/pipeline.py): two round trips, one more when consumed
message ids are recorded (a consumed id is refused at once), one more when flow requests are
claimed (checked before the commit). A write that fails fails the transaction: nothing
commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy.exc import IntegrityError

from benchmarks.round_trips import counting_wait
from foundation.engine import drop_schema
from persistence.store import NodeDatabase
from persistence.worker_process import WorkerInfo
from statemachine.actions import ClaimFlowRequests, StoreFlowResult
from statemachine.ports import OutboxRow
from tests.conftest import POSTGRES_URL, postgres_problem, require_service
from tests.store_conformance import FLOW_CLASS, record, write_group


@pytest.fixture
def database() -> Iterator[NodeDatabase]:
    require_service("PostgreSQL", postgres_problem())
    schema_name = f"ff_pipeline_{uuid.uuid4().hex[:10]}"
    opened = NodeDatabase(POSTGRES_URL, schema_name=schema_name)
    lease = opened.new_lease(WorkerInfo.of_this_process(), 30.0)
    lease.acquire()
    opened.lease = lease  # every transaction checks it first, as a node's do
    try:
        yield opened
    finally:
        lease.release()
        opened.close()
        drop_schema(POSTGRES_URL, schema_name)


@pytest.fixture
def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each psycopg wait for the server's reply, by the generator's name.

    A wait whose reply had already arrived does not show as one: the count is at most the
    round trips made, so the tests bound it from above.
    """
    import psycopg

    waits: list[str] = []
    wait = counting_wait(
        psycopg.Connection.wait, lambda gen: waits.append(getattr(gen, "__name__", "?"))
    )
    monkeypatch.setattr(psycopg.Connection, "wait", wait)
    return waits


def _outbox(count: int) -> list[tuple[OutboxRow, float]]:
    return [(OutboxRow(f"out-{n}", "O=Peer,L=Paris,C=FR", b"frame"), 1.0) for n in range(count)]


def test_writes_and_commit_cost_one_round_trip_after_the_lease_check(
    database: NodeDatabase, round_trips: list[str]
) -> None:
    transaction = database.checkpoints.begin()
    transaction.write_outbox(_outbox(5))
    transaction.store_results(
        [StoreFlowResult(f"f-{n}", FLOW_CLASS, b"\x01", 1.0) for n in range(5)]
    )
    transaction.commit()
    assert len(round_trips) <= 2, round_trips  # the lease check; the writes and COMMIT
    assert database.count("node_outbox") == 5
    assert database.count("node_flow_results") == 5


def test_recording_consumed_ids_waits_once_more(
    database: NodeDatabase, round_trips: list[str]
) -> None:
    transaction = database.checkpoints.begin()
    write_group(transaction, "a")  # checkpoint, dedup id, outbox row, result, error
    transaction.commit()
    assert len(round_trips) <= 3, round_trips  # (one a statement: 8)


def test_claims_are_checked_before_the_commit(
    database: NodeDatabase, round_trips: list[str]
) -> None:
    from persistence.node_store import FlowRequest
    from persistence.sql_transaction import FlowRequestClaimError

    database.control.request_flows([FlowRequest("r-1", FLOW_CLASS, b"")], 1.0)
    round_trips.clear()
    transaction = database.checkpoints.begin()
    transaction.write_outbox(_outbox(1))
    transaction.claim_flow_requests([ClaimFlowRequests(("r-1",), 2.0)])
    transaction.commit()
    assert len(round_trips) <= 3, round_trips
    transaction = database.checkpoints.begin()
    transaction.write_outbox([(OutboxRow("out-late", "O=Peer,L=Paris,C=FR", b"x"), 3.0)])
    transaction.claim_flow_requests([ClaimFlowRequests(("r-1",), 3.0)])  # claimed before
    with pytest.raises(FlowRequestClaimError):
        transaction.commit()
    transaction.rollback()
    assert [row.message_id for row in database.outbox.pending_outbox()] == ["out-0"]


def test_a_failing_write_fails_the_transaction_and_nothing_commits(
    database: NodeDatabase,
) -> None:
    transaction = database.checkpoints.begin()
    transaction.record_inbound([record("m-1")])
    transaction.commit()
    transaction = database.checkpoints.begin()
    transaction.write_outbox(_outbox(2))
    with pytest.raises(IntegrityError):
        transaction.record_inbound([record("m-1")])  # consumed already: refused at once
    transaction.rollback()
    transaction = database.checkpoints.begin()
    transaction.write_outbox(_outbox(2))
    transaction.store_results([StoreFlowResult("twice", FLOW_CLASS, b"\x01", 1.0)] * 2)
    with pytest.raises(IntegrityError):
        transaction.commit()  # the second result breaks the key: COMMIT never runs
    transaction.rollback()
    assert database.count("node_outbox") == 0
    assert database.count("node_flow_results") == 0
    transaction = database.checkpoints.begin()  # the connection is usable again
    transaction.write_outbox(_outbox(1))
    transaction.commit()
    assert database.count("node_outbox") == 1
