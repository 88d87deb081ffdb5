"""The node lease: one writer per node, takeover of expired or dead holders, fencing.

Each case runs on SQLite and on PostgreSQL (a schema of its own). Process-level cases (two
real node processes, SIGSTOP and SIGCONT) are in ``tests/process/test_single_writer.py``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from sqlalchemy import event, func, select, text, update
from sqlalchemy.exc import OperationalError

from flows.node.assembly import build_node
from flows.testing import MockNetwork
from foundation.engine import application_name, drop_schema
from persistence import schema
from persistence.lease import LeaseHeldError, LeaseLostError, NodeLease
from persistence.store import NodeDatabase
from persistence.worker_process import WorkerInfo, process_start_ticks, process_state
from statemachine.partitions import PARTITIONS, partition_of
from statemachine.ports import InboundMessage
from tests.conftest import database_for
from tests.cordapp import PaymentFlow, ledger_entries
from tests.unit.test_flow_effects import with_ledger
from tests.waiting import wait_until


@attrs.frozen
class Opened:
    """A way to open the same node database several times (as several processes would)."""

    url: str
    schema_name: str | None

    def database(self, worker: WorkerInfo | None = None) -> NodeDatabase:
        return NodeDatabase(
            self.url,
            synchronous="NORMAL" if self.url.startswith("sqlite") else "FULL",
            schema_name=self.schema_name,
            application_name=None if worker is None else application_name(worker.worker_id),
        )


@pytest.fixture
def opened(tmp_path: Path, backend: str) -> Iterator[Opened]:
    if backend == "sqlite":
        yield Opened(f"sqlite:///{tmp_path / 'node.db'}", None)
        return
    name = f"fflease_{uuid.uuid4().hex[:10]}"
    yield Opened(backend, name)
    drop_schema(backend, name)


def expire(database: NodeDatabase) -> None:
    """Make every lease of the database run out now (as if its holder stopped renewing)."""
    with database.engine.begin() as connection:
        connection.execute(update(schema.node_workers).values(expires_at=0))


def another_process() -> WorkerInfo:
    """A worker on this host whose process is alive (this one), under another worker id."""
    return WorkerInfo.of_this_process()


def dead_process() -> WorkerInfo:
    """A worker on this host whose process has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return attrs.evolve(WorkerInfo.of_this_process(), pid=child.pid, process_start=0)


def test_the_first_worker_takes_every_partition_at_epoch_one(opened: Opened) -> None:
    database = opened.database()
    try:
        lease = database.new_lease(None, 20)
        lease.acquire()
        assert lease.epochs == dict.fromkeys(range(PARTITIONS), 1)
        (holder,) = lease.holders()
        assert holder.worker == lease.worker
        assert holder.expires_at - holder.renewed_at == 20_000
        lease.release()
        assert lease.holders() == []
    finally:
        database.close()


def test_a_second_live_worker_is_refused_naming_the_holder(opened: Opened) -> None:
    first, second = opened.database(), opened.database()
    try:
        holder = first.new_lease(None, 20)
        holder.acquire()
        with pytest.raises(LeaseHeldError) as refused:
            second.new_lease(another_process(), 20).acquire()
        message = str(refused.value)
        assert f"pid {holder.worker.pid} on host {holder.worker.host}" in message
        assert f"(worker {holder.worker_id[:8]})" in message
        assert " since 20" in message and " UTC" in message and "refusing to start" in message
        first.lease = holder
        with first.fenced():  # the holder is unaffected
            pass
    finally:
        first.close()
        second.close()


def test_a_released_lease_is_taken_with_the_next_epoch(opened: Opened) -> None:
    first, second = opened.database(), opened.database()
    try:
        lease = first.new_lease(None, 20)
        lease.acquire()
        lease.release()
        successor = second.new_lease(another_process(), 20)
        successor.acquire()
        assert successor.epochs == dict.fromkeys(range(PARTITIONS), 2)
        assert successor.taken_over_from == []  # released, not taken over
    finally:
        first.close()
        second.close()


def test_an_expired_holder_is_taken_over_and_fenced_out(opened: Opened) -> None:
    old_db, new_db = opened.database(), opened.database()
    try:
        old = old_db.new_lease(None, 20)
        old.acquire()
        old_db.lease = old
        with old_db.fenced():  # holding: writes go through
            pass
        with pytest.raises(LeaseHeldError):
            new_db.new_lease(another_process(), 20).acquire()
        expire(old_db)  # the old holder does not renew: its lease runs out
        new = new_db.new_lease(another_process(), 20)
        new.acquire()
        assert new.taken_over_from == [old.worker]
        assert new.epochs == dict.fromkeys(range(PARTITIONS), 2)
        # The old holder thaws: it can commit nothing, and renewing tells it it lost.
        with pytest.raises(LeaseLostError, match="lost partitions"):
            old_db.checkpoints.begin()
        with pytest.raises(LeaseLostError):
            stray = InboundMessage("m", "O=X,L=Y,C=GB", b"")
            old_db.checkpoints.dead_letter(stray, "x", time.time())
        with pytest.raises(LeaseLostError):
            old.renew()
        assert old_db.count("node_dead_letters") == 0
        assert [h.worker for h in new.holders()] == [new.worker]  # the old row is gone
    finally:
        old_db.close()
        new_db.close()


def test_a_holder_whose_process_died_is_taken_over_at_once(opened: Opened) -> None:
    first, second = opened.database(), opened.database()
    try:
        ghost = first.new_lease(dead_process(), 20)  # unexpired for 20 s, but its process is gone
        ghost.acquire()
        successor = second.new_lease(another_process(), 20)
        successor.acquire()
        assert successor.taken_over_from == [ghost.worker]
    finally:
        first.close()
        second.close()


def test_a_holder_whose_process_ended_unreaped_is_taken_over_at_once(opened: Opened) -> None:
    """A zombie (killed, its parent not waiting for it yet) is a gone process."""
    first, second = opened.database(), opened.database()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ghost = attrs.evolve(
            WorkerInfo.of_this_process(),
            pid=child.pid,
            process_start=process_start_ticks(child.pid) or 0,
        )
        first.new_lease(ghost, 20).acquire()
        child.kill()
        wait_until(lambda: process_state(child.pid) == "Z", "the child to be a zombie", 10)
        successor = second.new_lease(another_process(), 20)
        successor.acquire()
        assert successor.taken_over_from == [ghost]
    finally:
        child.kill()
        child.wait()
        first.close()
        second.close()


def test_a_holder_on_another_host_is_not_judged_by_its_pid(opened: Opened) -> None:
    first, second = opened.database(), opened.database()
    try:
        elsewhere = attrs.evolve(dead_process(), host="some-other-host")
        first.new_lease(elsewhere, 20).acquire()
        with pytest.raises(LeaseHeldError, match="some-other-host"):
            second.new_lease(another_process(), 20).acquire()
    finally:
        first.close()
        second.close()


def test_an_expired_lease_nobody_took_is_renewed(opened: Opened) -> None:
    database = opened.database()
    try:
        lease = database.new_lease(None, 20)
        lease.acquire()
        database.lease = lease
        expire(database)
        lease.renew()  # never replaced: still the holder
        with database.fenced():
            pass
        (holder,) = lease.holders()
        assert holder.expires_at > holder.renewed_at
    finally:
        database.close()


def test_a_takeover_waits_for_a_commit_in_progress(opened: Opened) -> None:
    """The fence holds off a takeover until the fenced transaction ends (then it wins).

    Observed, not timed: on PostgreSQL the takeover's session is seen waiting for a lock
    (``pg_stat_activity``) while the commit is open; on SQLite, whose writers wait in a busy
    handler nobody can watch, a takeover without one is refused at once ("database is
    locked"). Either way the takeover goes through once the commit ends.
    """
    thief_worker = another_process()
    old_db, new_db = opened.database(), opened.database(thief_worker)
    try:
        old = old_db.new_lease(None, 20)
        old.acquire()
        old_db.lease = old
        expire(old_db)  # (in its own transaction, before the commit below begins)
        # Fenced: the check ran, the transaction stays open.
        transaction = old_db.checkpoints.begin()
        if new_db.engine.dialect.name == "sqlite":
            event.listen(new_db.engine, "checkout", _no_busy_wait)
            with pytest.raises(OperationalError, match="database is locked"):
                new_db.new_lease(thief_worker, 20).acquire()
            transaction.commit()  # the old holder's commit, begun while it held the lease
            new_db.new_lease(thief_worker, 20).acquire()
        else:
            taken = threading.Event()
            errors: list[BaseException] = []

            def take_over() -> None:
                try:
                    new_db.new_lease(thief_worker, 20).acquire()
                    taken.set()
                except BaseException as error:  # reported below
                    errors.append(error)

            thief = threading.Thread(target=take_over)
            thief.start()
            name = application_name(thief_worker.worker_id)
            wait_until(
                lambda: _waits_for_a_lock(old_db, name) or taken.is_set() or bool(errors),
                "the takeover to wait for the open commit's locks",
                timeout=30,
            )
            assert not taken.is_set() and not errors, (
                "a takeover went through while a fenced commit was open"
            )
            transaction.commit()  # the old holder's commit, begun while it held the lease
            thief.join(30)
            assert not errors and taken.is_set()
        with pytest.raises(LeaseLostError):
            old_db.checkpoints.begin()
    finally:
        old_db.close()
        new_db.close()


def _no_busy_wait(dbapi_connection: Any, _record: object, _proxy: object) -> None:
    """Make a SQLite connection give up at once on a locked database (no busy handler)."""
    dbapi_connection.execute("PRAGMA busy_timeout = 0")


def _waits_for_a_lock(database: NodeDatabase, name: str) -> bool:
    """True while a PostgreSQL session named ``name`` waits for a lock."""
    with database.engine.connect() as connection:
        waiting = connection.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = :name AND wait_event_type = 'Lock'"
            ),
            {"name": name},
        ).scalar_one()
    return bool(waiting)


@pytest.fixture
def postgres_opened() -> Iterator[Opened]:
    url = database_for("postgresql")
    name = f"fflease_{uuid.uuid4().hex[:10]}"
    yield Opened(url, name)
    drop_schema(url, name)


def test_postgresql_ends_the_sessions_of_a_holder_frozen_in_a_transaction(
    postgres_opened: Opened,
) -> None:
    """A holder paused in the middle of a commit past its lease: its session is ended.

    (On SQLite such a holder keeps the database's write lock: the takeover waits until it
    thaws, and then its next commit fails the fence.)
    """
    opened = postgres_opened
    frozen_worker = another_process()
    old_db, new_db = opened.database(frozen_worker), opened.database()
    try:
        old = old_db.new_lease(frozen_worker, 20)
        old.acquire()
        old_db.lease = old
        expire(old_db)
        transaction = old_db.checkpoints.begin()  # holds its FOR SHARE lock, then "freezes"
        new = new_db.new_lease(another_process(), 20)
        new.acquire()  # waits for the lock, ends the frozen session, takes over
        assert new.taken_over_from == [frozen_worker]
        with pytest.raises(Exception, match="terminat|closed|connection"):
            transaction.commit()
    finally:
        old_db.close()
        new_db.close()


def test_flows_map_to_partitions_evenly() -> None:
    counts = [0] * PARTITIONS
    for _ in range(16_000):
        counts[partition_of(uuid.uuid4().hex)] += 1
    assert min(counts) > 800 and max(counts) < 1200


def test_lease_rows_are_plain_columns(opened: Opened) -> None:
    database = opened.database()
    try:
        lease = database.new_lease(None, 20)
        lease.acquire()
        with database.engine.connect() as connection:
            rows = connection.execute(select(schema.node_partitions)).all()
            assert {row.holder for row in rows} == {lease.worker_id}
            workers = select(func.count()).select_from(schema.node_workers)
            assert connection.execute(workers).scalar() == 1
    finally:
        database.close()


def test_a_lease_needs_positive_seconds(opened: Opened) -> None:
    database = opened.database()
    try:
        with pytest.raises(ValueError, match="positive"):
            NodeLease(database.engine, None, 0)
    finally:
        database.close()


def test_a_thawed_node_commits_nothing_after_another_took_over(net: MockNetwork) -> None:
    """In one process, step by step: the replaced node's next commit is refused."""
    alice = with_ledger(net.create_node("O=Alice,L=London,C=GB"))
    carol = with_ledger(net.create_node("O=Carol,L=Paris,C=FR"))
    handles = [alice.start_flow(PaymentFlow(carol.party, amount)) for amount in (1, 2, 3)]
    alice.run_once()  # the debits commit, the payments go out
    for _ in range(10):  # Carol credits and answers; her receipts wait in Alice's queue
        if net.messaging.pending(alice.name) >= 3:
            break
        carol.run_once()
    assert net.messaging.pending(alice.name) >= 3
    old = alice.node
    assert net.messaging.deliver(alice.name) > 0  # handed to the old node, not yet processed
    database = old.database
    assert isinstance(database, NodeDatabase)
    with database.engine.begin() as connection:  # the old node is "frozen" past its lease
        connection.execute(update(schema.node_workers).values(expires_at=0))
    successor = build_node(
        alice.config,
        net.messaging.endpoint(alice.name),
        clock=net.clock,
        identity=alice.identity,
        peers=net.peer_keys,
    )
    successor.start()
    assert successor.lease is not None and successor.lease.taken_over_from
    # It thaws with the receipts in hand: its commit is fenced out (on PostgreSQL the
    # successor has also ended its database sessions: it fails on the first statement).
    with pytest.raises((LeaseLostError, OperationalError)):
        old.run_once()
    assert [e for _, e in ledger_entries(database.engine) if e.startswith("receipt")] == []
    old.stop()  # (its unacknowledged deliveries go back to the queue)
    alice.node = successor
    net.run_network()
    assert [h.result() for h in handles] == ["receipt 1", "receipt 2", "receipt 3"]
    entries = ledger_entries(successor.database.engine)  # type: ignore[union-attr]
    for handle, amount in zip(handles, (1, 2, 3), strict=True):
        mine = [entry for flow_id, entry in entries if flow_id == handle.flow_id]
        assert mine == [f"debit {amount}", f"receipt {amount}"]


def test_a_replaced_node_drops_nothing_meant_for_its_successor(net: MockNetwork) -> None:
    """A replaced process that has not noticed yet must not settle (lose) a message for a
    session it does not know: it may belong to a flow its successor started."""
    alice = with_ledger(net.create_node("O=Alice,L=London,C=GB"))
    carol = with_ledger(net.create_node("O=Carol,L=Paris,C=FR"))
    old = alice.node
    old_endpoint = old.messaging
    database = old.database
    assert isinstance(database, NodeDatabase)
    expire(database)  # paused past its lease
    successor = build_node(
        alice.config,
        net.messaging.endpoint(alice.name),
        clock=net.clock,
        identity=alice.identity,
        peers=net.peer_keys,
    )
    successor.start()
    alice.node = successor
    handle = alice.start_flow(PaymentFlow(carol.party, 7))  # a flow only the successor knows
    for _ in range(20):
        if net.messaging.pending(alice.name):
            break
        successor.run_once()
        carol.run_once()
    assert net.messaging.pending(alice.name) >= 1  # Carol's answer waits for Alice
    net.messaging._endpoints[alice.name] = old_endpoint  # the old process consumes it
    assert net.messaging.deliver(alice.name) >= 1
    # It would drop it as late: it checks its lease first (on PostgreSQL its sessions were
    # also ended by the successor: it fails on the first statement).
    with pytest.raises((LeaseLostError, OperationalError)):
        old.run_once()
    old.stop()  # its unacknowledged deliveries go back to the queue
    net.messaging._endpoints[alice.name] = successor.messaging
    net.run_network()
    assert handle.result() == "receipt 7"


def test_a_worker_in_another_pid_namespace_is_not_judged_by_its_pid(opened: Opened) -> None:
    first, second = opened.database(), opened.database()
    try:
        foreign = attrs.evolve(dead_process(), pid_namespace=1)  # same host, other container
        first.new_lease(foreign, 20).acquire()
        with pytest.raises(LeaseHeldError):
            second.new_lease(another_process(), 20).acquire()
    finally:
        first.close()
        second.close()
