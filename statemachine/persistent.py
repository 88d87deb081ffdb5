"""Persistent (immutable, structure-sharing) vectors for the frozen flow state.

A flow's state is a frozen value and every transition builds a new one. With plain tuples,
changing one of N sessions or appending one of N journal entries copies all N items: a flow
with many sessions (or a long journal) then costs O(N) per message and O(N^2) in all. The
sequences that grow with a flow are therefore pyrsistent's ``PVector`` (a 32-way trie, in C
when pyrsistent's extension is built): reading, replacing or appending one item copies one
path of at most ``log32(N)`` nodes, and the rest is shared with the value it was built from.

The C vector's garbage-collector traversal visits every item, so a young-generation
collection that finds a freshly built vector of N items costs O(N) (docs/architecture.md).

A ``PVector`` equals a list of the same items but not a tuple, and hashes differently from
one; the checkpoint serializer encodes it exactly as the tuple of its items (see
:mod:`persistence.checkpoint_codec`). Sessions live in a
:class:`~statemachine.session_table.SessionTable`, which also indexes them by id.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar, cast

from pyrsistent import PVector, pvector

T = TypeVar("T")

VECTOR_TYPE: type = type(pvector())
"""The concrete class of pyrsistent's vectors (the C extension's when it is built)."""


EMPTY_VECTOR: PVector[object] = pvector()
"""The empty vector (immutable, so shared): what a commit leaves in the state's queues."""


def vector_of(items: Iterable[T]) -> PVector[T]:
    """``items`` itself if it is already a persistent vector (O(1)), else a new one (O(n)).

    attrs runs a field's converter on every ``attrs.evolve``, so passing a vector through
    unchanged is what keeps a step O(log n). The exact type is checked first: an
    ``isinstance`` against pyrsistent's abstract ``PVector`` costs several times more, and it
    runs five times per step.
    """
    if type(items) is VECTOR_TYPE:
        return cast("PVector[T]", items)
    if items == ():
        return cast("PVector[T]", EMPTY_VECTOR)
    return pvector(items)
