"""Partitions: the target flow of a message from its header, and the fair share of workers."""

from __future__ import annotations

import uuid
from random import Random

from hypothesis import given
from hypothesis import strategies as st

from statemachine.partitions import (
    PARTITIONS,
    assign_partitions,
    fair_quotas,
    partition_of,
    partition_of_message,
    target_flow_of_message,
)
from statemachine.session_ids import (
    identity_tag,
    initiator_session_id,
    message_id,
    owner_of_session,
    peer_session_id,
    responder_flow_id,
    responder_session_id,
)

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=Paris,C=FR"


def test_a_message_from_the_initiator_is_for_the_responder_flow_the_receiver_derives() -> None:
    flow = uuid.uuid4().hex
    session = initiator_session_id(flow, 0, identity_tag(ALICE))
    for sequence in (0, 1, 17):
        assert target_flow_of_message(message_id(session, sequence), ALICE) == (
            responder_flow_id(ALICE, session)
        )
    # The same session id from another sender names another flow (the sender is bound in).
    assert target_flow_of_message(message_id(session, 0), BOB) != responder_flow_id(ALICE, session)


def test_a_message_from_the_responder_is_for_the_initiating_flow() -> None:
    flow = uuid.uuid4().hex
    session = initiator_session_id(flow, 3, identity_tag(ALICE))
    answer = message_id(responder_session_id(session), 5)
    assert target_flow_of_message(answer, BOB) == flow


@given(
    flow=st.uuids().map(lambda u: u.hex),
    index=st.integers(0, 10_000),
    sequence=st.integers(0, 10**9),
    from_responder=st.booleans(),
)
def test_the_target_agrees_with_the_owner_routing_finds_for_the_recipient_session(
    flow: str, index: int, sequence: int, from_responder: bool
) -> None:
    """Routing (after decoding) and partitioning (before) name the same flow."""
    initiator = initiator_session_id(flow, index, identity_tag(ALICE))
    sender_session, sender = (
        (responder_session_id(initiator), BOB) if from_responder else (initiator, ALICE)
    )
    recipient_session = peer_session_id(sender_session)
    expected = owner_of_session(recipient_session, sender)
    assert target_flow_of_message(message_id(sender_session, sequence), sender) == expected
    assert partition_of_message(message_id(sender_session, sequence), sender) == (
        partition_of(expected)
    )


@given(st.text(max_size=80))
def test_any_message_id_has_a_partition(message: str) -> None:
    assert 0 <= partition_of_message(message, ALICE) < PARTITIONS


def test_malformed_message_ids_have_no_target() -> None:
    for bad in ("", "x", "N-", "N-abc", "N-abc-", "N--1", "N-abc-x1", "M-abc-1"):
        assert target_flow_of_message(bad, ALICE) is None, bad


workers_strategy = st.lists(st.sampled_from([f"w{i}" for i in range(8)]), max_size=8, unique=True)
holders_strategy = st.dictionaries(
    st.integers(0, PARTITIONS - 1), st.none() | st.sampled_from([f"w{i}" for i in range(10)])
)


@given(holders_strategy, workers_strategy)
def test_every_partition_goes_to_one_live_worker_in_fair_shares(
    holders: dict[int, str | None], workers: list[str]
) -> None:
    assignment = assign_partitions(holders, workers)
    if not workers:
        assert assignment == {}
        return
    assert sorted(assignment) == list(range(PARTITIONS))
    assert set(assignment.values()) <= set(workers)
    counts = [list(assignment.values()).count(worker) for worker in workers]
    base = PARTITIONS // len(workers)
    assert min(counts) >= base and max(counts) <= base + 1
    assert sum(counts) == PARTITIONS


@given(holders_strategy, workers_strategy)
def test_as_few_partitions_move_as_the_shares_allow(
    holders: dict[int, str | None], workers: list[str]
) -> None:
    """A live holder keeps every partition it can; the moves are exactly the surplus + free."""
    assignment = assign_partitions(holders, workers)
    if not workers:
        return
    live_held: dict[str, list[int]] = {worker: [] for worker in workers}
    for partition, holder in holders.items():
        if holder in live_held:
            live_held[holder].append(partition)
    quotas = fair_quotas(workers, {w: len(ps) for w, ps in live_held.items()}, PARTITIONS)
    kept = sum(min(len(ps), quotas[w]) for w, ps in live_held.items())
    stayed = sum(
        1 for p, holder in holders.items() if holder in live_held and assignment[p] == holder
    )
    assert stayed == kept


@given(holders_strategy, workers_strategy, st.randoms(use_true_random=False))
def test_every_worker_computes_the_same_assignment(
    holders: dict[int, str | None], workers: list[str], random: Random
) -> None:
    shuffled = list(workers)
    random.shuffle(shuffled)
    assert assign_partitions(holders, workers) == assign_partitions(holders, shuffled)


@given(workers_strategy.filter(bool), st.integers(0, 7))
def test_repeated_assignment_is_stable(workers: list[str], joiner: int) -> None:
    """From any settled assignment nothing moves; a join moves only to the newcomer."""
    settled = assign_partitions({}, workers)
    assert assign_partitions(dict(settled), workers) == settled
    newcomer = f"new{joiner}"
    after = assign_partitions(dict(settled), [*workers, newcomer])
    moved = {p for p in range(PARTITIONS) if after[p] != settled[p]}
    assert {after[p] for p in moved} <= {newcomer}
    assert len(moved) == PARTITIONS // (len(workers) + 1)


def test_quotas_give_the_remainder_to_the_workers_holding_most() -> None:
    assert fair_quotas(["a", "b", "c"], {"c": 9, "a": 7}, 16) == {"c": 6, "a": 5, "b": 5}
    assert fair_quotas(["a", "b", "c"], {}, 16) == {"a": 6, "b": 5, "c": 5}
    assert fair_quotas([], {}, 16) == {}
    assert sum(fair_quotas([f"w{i}" for i in range(20)], {}, 16).values()) == 16
