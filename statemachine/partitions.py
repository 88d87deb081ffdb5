"""Partitions of a node's flows: where a flow or a message belongs, who holds each partition.

Pure functions, no I/O.

A node's flows are divided into :data:`PARTITIONS` partitions by flow id. Each partition is
held by one worker process of the node at a time (:mod:`persistence.lease`); a worker runs
the flows of the partitions it holds and only those.

* :func:`partition_of` maps a flow id to its partition.
* :func:`target_flow_of_message` names the flow an inbound session message is for, from its
  id and its sender alone (both travel outside the authenticated payload), so the partition
  of every inbound message is known before anything decodes it: the initiator's flow id is
  in its session id; a responder's flow id is derived from its sender and the initiator's
  session id (:func:`~statemachine.session_ids.responder_flow_id`).
* :func:`assign_partitions` is the fair share every worker computes from the same table of
  live workers: each holds ``PARTITIONS // n`` or one more, and a partition stays where it is
  whenever the share allows, so a join or a leave moves as few partitions as possible.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

from statemachine.session_ids import MESSAGE_ID_PREFIX, owner_of_session, peer_session_id

PARTITIONS = 16
"""Partitions of a node's flows (fixed for a database: its rows are made with it)."""


def partition_of(flow_id: str) -> int:
    """The partition of a flow: CRC-32 of its id modulo :data:`PARTITIONS`."""
    return zlib.crc32(flow_id.encode()) % PARTITIONS


def target_flow_of_message(message_id: str, sender: str) -> str | None:
    """The id of the flow a session message ``message_id`` from ``sender`` is for.

    A session message id is ``N-<sender's session id>-<sequence>``
    (:func:`~statemachine.session_ids.message_id`). Sent from a responder's session
    (``...r``), it is for the initiator, whose flow id is in the session id; sent from an
    initiator's session, it is for the responder flow the receiver derives from the sender
    and that session id. None if ``message_id`` does not have that shape (such a message is
    dead-lettered by whoever consumes it).
    """
    if not message_id.startswith(MESSAGE_ID_PREFIX):
        return None
    session_id, dash, sequence = message_id[len(MESSAGE_ID_PREFIX) :].rpartition("-")
    if not dash or not session_id or not sequence.isdigit():
        return None
    return owner_of_session(peer_session_id(session_id), sender)


def sending_flow_of_message(message_id: str, target: str) -> str | None:
    """The id of our flow that sent the session message ``message_id`` to ``target``.

    The message id names the sending session (ours); the flow that owns it is found as for a
    session ``target`` talks on (:func:`~statemachine.session_ids.owner_of_session`). None if
    ``message_id`` does not have a session message's shape.
    """
    if not message_id.startswith(MESSAGE_ID_PREFIX):
        return None
    session_id, dash, sequence = message_id[len(MESSAGE_ID_PREFIX) :].rpartition("-")
    if not dash or not session_id or not sequence.isdigit():
        return None
    return owner_of_session(session_id, target)


def partition_of_message(message_id: str, sender: str) -> int:
    """The partition whose holder must process the message ``message_id`` from ``sender``.

    That of its target flow (:func:`target_flow_of_message`); a message without a target
    (malformed, forged) goes to the partition of its id, where its consumer dead-letters it.
    """
    target = target_flow_of_message(message_id, sender)
    return partition_of(target if target is not None else message_id)


def fair_quotas(workers: Iterable[str], held: Mapping[str, int], partitions: int) -> dict[str, int]:
    """How many partitions each of ``workers`` should hold.

    ``partitions // n`` each; the remainder goes one each to the workers holding most now
    (``held``: worker -> partitions held), ties broken by worker id, so the remainder does
    not wander between workers from one computation to the next.
    """
    ordered = sorted(set(workers), key=lambda worker: (-held.get(worker, 0), worker))
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    return {worker: base + (1 if rank < extra else 0) for rank, worker in enumerate(ordered)}


def assign_partitions(
    holders: Mapping[int, str | None], workers: Iterable[str], partitions: int = PARTITIONS
) -> dict[int, str]:
    """Who should hold each partition: the fair share, moving as few partitions as possible.

    ``holders`` maps a partition to its current holder (None or absent: free; a holder not
    among ``workers`` counts as free: it is dead or leaving). Each live worker keeps the
    partitions it holds, lowest-numbered first, up to its quota (:func:`fair_quotas`); the
    rest go, lowest-numbered first, to the workers below their quota, in worker-id order.
    Empty when there is no worker.
    """
    live = sorted(set(workers))
    if not live:
        return {}
    kept: dict[str, list[int]] = {worker: [] for worker in live}
    for partition in range(partitions):
        holder = holders.get(partition)
        if holder in kept:
            kept[holder].append(partition)
    quotas = fair_quotas(live, {w: len(ps) for w, ps in kept.items()}, partitions)
    assignment: dict[int, str] = {}
    for worker in live:
        for partition in kept[worker][: quotas[worker]]:
            assignment[partition] = worker
    free = [p for p in range(partitions) if p not in assignment]
    takers = iter(w for w in live for _ in range(quotas[w] - min(quotas[w], len(kept[w]))))
    for partition, worker in zip(free, takers, strict=True):
        assignment[partition] = worker
    return assignment


def partition_ranges(partitions: Iterable[int]) -> str:
    """``0-3,8,10-11`` for a set of partitions (``none`` if empty): for logs and reports."""
    runs: list[list[int]] = []
    for partition in sorted(set(partitions)):
        if runs and partition == runs[-1][-1] + 1:
            runs[-1].append(partition)
        else:
            runs.append([partition])
    if not runs:
        return "none"
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


__all__ = [
    "PARTITIONS",
    "assign_partitions",
    "fair_quotas",
    "partition_of",
    "partition_of_message",
    "partition_ranges",
    "target_flow_of_message",
]
