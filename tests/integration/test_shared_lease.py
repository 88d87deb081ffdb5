"""A node run by several workers: fair shares of the partitions, hand-overs, takeovers, fencing.

The lease alone, on PostgreSQL (a schema of its own per test); workers are leases opened on
separate database handles, as separate processes would hold them. SQLite refuses workers.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from foundation.engine import drop_schema
from persistence import schema
from persistence.lease import (
    SQLITE_SINGLE_PROCESS,
    LeaseError,
    LeaseHeldError,
    LeaseLostError,
    NodeLease,
    PartitionNotHeldError,
)
from persistence.store import NodeDatabase
from persistence.worker_process import WorkerInfo
from statemachine.actions import RemoveCheckpoint
from statemachine.partitions import PARTITIONS, partition_of
from tests.process.test_lease import Opened, dead_process, postgres_opened

__all__ = ["postgres_opened"]  # (a fixture, shared with tests/process/test_lease.py)


@attrs.define
class Workers:
    """Workers of one node, each with a database handle of its own."""

    opened: Opened
    databases: list[NodeDatabase] = attrs.Factory(list)

    def start(self, name: str, worker: WorkerInfo | None = None) -> NodeLease:
        worker = worker or WorkerInfo.of_this_process(name=name)
        database = self.opened.database(worker)
        self.databases.append(database)
        lease = database.new_lease(worker, 20, shared=True)
        lease.acquire()
        database.lease = lease
        return lease

    def close(self) -> None:
        for database in self.databases:
            database.close()


@pytest.fixture
def workers(postgres_opened: Opened) -> Iterator[Workers]:
    group = Workers(postgres_opened)
    yield group
    group.close()


def settle(leases: list[NodeLease], rounds: int = 4) -> None:
    """Rebalance every worker in turn, releasing what each is asked to, until nothing moves."""
    for _ in range(rounds):
        moved = False
        for lease in leases:
            change = lease.rebalance()
            if change.to_release:
                lease.release_partitions(change.to_release)
            moved = moved or bool(change.taken or change.to_release)
        if not moved:
            return
    raise AssertionError("the workers did not settle")


def held_by(leases: list[NodeLease]) -> Counter[str]:
    return Counter(lease.worker.name for lease in leases for _ in lease.epochs)


def assert_disjoint_and_complete(leases: list[NodeLease]) -> None:
    seen: dict[int, str] = {}
    for lease in leases:
        for partition in lease.epochs:
            assert partition not in seen, f"partition {partition} held twice"
            seen[partition] = lease.worker.name
    assert sorted(seen) == list(range(PARTITIONS))
    table = leases[0].assignment()
    for lease in leases:
        for partition in lease.epochs:
            assert table[partition] == lease.worker_id


def test_the_first_worker_takes_everything_and_a_second_takes_half(workers: Workers) -> None:
    one = workers.start("one")
    assert sorted(one.epochs) == list(range(PARTITIONS))
    two = workers.start("two")
    assert two.epochs == {}  # nothing is free yet: "one" hands over at its next rebalance
    settle([one, two])
    assert held_by([one, two]) == {"one": 8, "two": 8}
    assert_disjoint_and_complete([one, two])
    # Handed-over partitions come with the next epoch: a write fenced at the old one fails.
    assert all(epoch == 2 for epoch in two.epochs.values())


def test_three_workers_share_sixteen_and_a_leaver_s_share_is_taken(workers: Workers) -> None:
    leases = [workers.start(name) for name in ("a", "b", "c")]
    settle(leases)
    assert sorted(held_by(leases).values()) == [5, 5, 6]
    assert_disjoint_and_complete(leases)
    leaving = leases.pop(1)
    leaving.release()  # a clean stop frees its partitions and its row at once
    settle(leases)
    assert held_by(leases) == {"a": 8, "c": 8}
    assert_disjoint_and_complete(leases)


def test_a_dead_worker_s_partitions_are_taken_over_and_it_is_fenced_out(
    workers: Workers,
) -> None:
    one, two = workers.start("one"), workers.start("two")
    settle([one, two])
    dying_db = workers.databases[1]
    with dying_db.engine.begin() as connection:  # "two" stops renewing: its lease runs out
        connection.execute(
            update(schema.node_workers)
            .where(schema.node_workers.c.worker_id == two.worker_id)
            .values(expires_at=0)
        )
    change = one.rebalance()
    assert change.taken == frozenset(two.epochs) and change.workers == 1
    assert sorted(one.epochs) == list(range(PARTITIONS))
    # Its database sessions were ended (application_name names the worker): the first try
    # fails on the closed connection, the next on the fence.
    with pytest.raises((OperationalError, LeaseLostError)):
        dying_db.checkpoints.begin()
    with pytest.raises(LeaseLostError, match="lost partitions"):
        dying_db.checkpoints.begin()
    with pytest.raises(LeaseLostError):
        two.rebalance()
    assert [h.worker.name for h in one.holders()] == ["one"]  # the dead row is gone


def test_a_worker_whose_process_died_loses_its_share_at_once(
    workers: Workers, tmp_path: Path
) -> None:
    ghost = workers.start("ghost", attrs.evolve(dead_process(), name="ghost"))
    assert sorted(ghost.epochs) == list(range(PARTITIONS))
    alive = workers.start("alive")
    assert sorted(alive.epochs) == list(range(PARTITIONS))  # the ghost's, all of them
    assert [h.worker.name for h in alive.holders()] == ["alive"]


def flow_in(partitions: Iterable[int]) -> str:
    wanted = set(partitions)
    while True:
        flow_id = uuid.uuid4().hex
        if partition_of(flow_id) in wanted:
            return flow_id


def test_a_commit_writing_a_flow_of_another_worker_s_partition_is_refused(
    workers: Workers,
) -> None:
    one, two = workers.start("one"), workers.start("two")
    settle([one, two])
    mine, theirs = flow_in(one.epochs), flow_in(two.epochs)
    one.check_writes([mine])
    with pytest.raises(PartitionNotHeldError, match="partitions it does not hold"):
        one.check_writes([mine, theirs])
    transaction = workers.databases[0].checkpoints.begin()
    transaction.remove_checkpoints([RemoveCheckpoint(theirs)])
    with pytest.raises(PartitionNotHeldError, match=theirs):
        transaction.commit()
    transaction = workers.databases[0].checkpoints.begin()
    transaction.remove_checkpoints([RemoveCheckpoint(mine)])
    transaction.commit()  # its own flow's write goes through


def test_a_second_worker_of_the_same_name_is_refused(workers: Workers) -> None:
    first = workers.start("same")
    with pytest.raises(LeaseHeldError, match="worker 'same' of the node is already running"):
        workers.start("same")
    assert sorted(first.epochs) == list(range(PARTITIONS))


def test_workers_and_a_single_process_node_exclude_each_other(
    workers: Workers, postgres_opened: Opened
) -> None:
    workers.start("one")
    single = postgres_opened.database()
    try:
        with pytest.raises(LeaseHeldError, match="running as several workers.*--worker NAME"):
            single.new_lease(WorkerInfo.of_this_process(), 20).acquire()
    finally:
        single.close()


def test_a_worker_cannot_join_a_node_running_as_one_process(postgres_opened: Opened) -> None:
    single = postgres_opened.database()
    try:
        single.new_lease(WorkerInfo.of_this_process(), 20).acquire()
        group = Workers(postgres_opened)
        try:
            with pytest.raises(LeaseHeldError, match="running as one process.*stop it"):
                group.start("one")
        finally:
            group.close()
    finally:
        single.close()


def test_sqlite_refuses_workers_saying_why(tmp_path: Path) -> None:
    database = NodeDatabase(f"sqlite:///{tmp_path / 'node.db'}", synchronous="NORMAL")
    try:
        lease = database.new_lease(WorkerInfo.of_this_process(name="one"), 20, shared=True)
        with pytest.raises(LeaseError) as refused:
            lease.acquire()
        assert str(refused.value) == SQLITE_SINGLE_PROCESS
        assert "SQLite runs as one process" in SQLITE_SINGLE_PROCESS.replace(
            "on SQLite ", "SQLite "
        )
    finally:
        database.close()


def test_a_release_that_did_not_commit_is_named_again(workers: Workers) -> None:
    one, two = workers.start("one"), workers.start("two")
    change = one.rebalance()
    assert len(change.to_release) == 8
    # The node stopped running those partitions but its release never reached the database.
    one.epochs = {p: e for p, e in one.epochs.items() if p not in change.to_release}
    again = one.rebalance()
    assert again.to_release == change.to_release
    one.release_partitions(again.to_release)  # nothing held in memory: nothing to free
    with workers.databases[0].engine.begin() as connection:  # so free them by hand, as
        connection.execute(  # release_partitions would have
            update(schema.node_partitions)
            .where(schema.node_partitions.c.partition.in_(change.to_release))
            .values(holder=None)
        )
    settle([one, two])
    assert held_by([one, two]) == {"one": 8, "two": 8}


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["join", "rebalance", "release", "leave", "die"]), st.integers(0, 5)
        ),
        min_size=5,
        max_size=30,
    )
)
def test_random_joins_leaves_deaths_and_rebalances_never_share_a_partition(
    postgres_opened: Opened, steps: list[tuple[str, int]]
) -> None:
    """Whatever order workers join, rebalance, hand over, leave and die in, no partition is
    ever held by two live workers, and once they settle every partition is held fairly."""
    name = f"ffshare_{uuid.uuid4().hex[:10]}"
    opened = attrs.evolve(postgres_opened, schema_name=name)
    group = Workers(opened)
    live: list[NodeLease] = []
    pending: dict[str, frozenset[int]] = {}
    joined = 0
    try:
        for action, pick in steps:
            if action == "join" or not live:
                joined += 1
                live.append(group.start(f"w{joined}"))
                continue
            lease = live[pick % len(live)]
            if action == "rebalance":
                change = lease.rebalance()
                pending[lease.worker_id] = change.to_release
            elif action == "release":
                lease.release_partitions(pending.pop(lease.worker_id, frozenset()))
            elif action == "leave":
                lease.release()
                live.remove(lease)
            else:  # die: its lease runs out without a release
                database = group.databases[[d.lease for d in group.databases].index(lease)]
                with database.engine.begin() as connection:
                    connection.execute(
                        update(schema.node_workers)
                        .where(schema.node_workers.c.worker_id == lease.worker_id)
                        .values(expires_at=0)
                    )
                live.remove(lease)
            held = [p for other in live for p in other.epochs]
            assert len(held) == len(set(held)), "a partition is held by two live workers"
        if live:
            settle(live)
            assert_disjoint_and_complete(live)
            counts = held_by(live).values()
            assert max(counts) - min(counts) <= 1 and len(counts) == min(len(live), PARTITIONS)
    finally:
        group.close()
        drop_schema(opened.url, name)
