"""A checkpoint's sessions: an ordered, immutable table looked up by session id.

Sessions are kept in the order the flow came to have them (that order is what a checkpoint
stores) in a pyrsistent ``PVector``, beside a pyrsistent ``PMap`` from session id to
position. Looking up, replacing or adding one session costs O(log32 n) and shares the rest
with the table it was built from (adding one also doubles the map's buckets once in a while:
amortized O(1)); replacing many at once goes through pyrsistent's evolvers, which copy each
changed trie node once. A session never leaves the table and never moves, so the index is
only ever added to.

Most flows have one or two sessions. Up to :data:`SMALL_TABLE` sessions the table has no
index: a lookup compares the ids of at most that many sessions, which costs less than one
lookup in pyrsistent's map (written in Python); the index is built once the table grows past
that size.

The table compares equal to (and hashes like, and is serialized as) the tuple of its
sessions; the index is derived and takes no part in equality.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, overload

from pyrsistent import PMap, PVector, pmap, pvector


class HasSessionId(Protocol):
    """What the table keeps: values with a ``session_id``."""

    @property
    def session_id(self) -> str:
        """The key of the value in the table."""


S = TypeVar("S", bound=HasSessionId)

SMALL_TABLE = 8
"""Up to this many sessions a table is searched in order instead of through an index."""


class SessionTable(Sequence[S], Generic[S]):
    """Sessions in order, with O(log n) lookup, replacement and append by session id."""

    __slots__ = ("_hash", "_items", "_positions")

    _items: PVector[S]
    _positions: PMap[str, int] | None
    """Position by session id; None while the table has at most :data:`SMALL_TABLE` items."""
    _hash: int | None

    def __init__(self, sessions: Iterable[S] = ()) -> None:
        """A table of ``sessions`` in order; a later session with the same id replaces one."""
        items: list[S] = []
        positions: dict[str, int] = {}
        for session in sessions:
            position = positions.get(session.session_id)
            if position is None:
                positions[session.session_id] = len(items)
                items.append(session)
            else:
                items[position] = session
        self._items, self._hash = pvector(items), None
        self._positions = pmap(positions) if len(items) > SMALL_TABLE else None

    @classmethod
    def of(cls, sessions: Iterable[S]) -> SessionTable[S]:
        """``sessions`` itself if it is already a table, else a new table of them."""
        if isinstance(sessions, SessionTable):
            return sessions
        return cls(sessions)

    @classmethod
    def _make(cls, items: PVector[S], positions: PMap[str, int] | None) -> SessionTable[S]:
        if positions is None and len(items) > SMALL_TABLE:  # grown past small: index it once
            positions = pmap({session.session_id: i for i, session in enumerate(items)})
        table: SessionTable[S] = cls.__new__(cls)
        table._items, table._positions, table._hash = items, positions, None
        return table

    def _position(self, session_id: str) -> int | None:
        """Where the session with this id is, or None."""
        if self._positions is not None:
            return self._positions.get(session_id)
        for position, session in enumerate(self._items):
            if session.session_id == session_id:
                return position
        return None

    def get(self, session_id: str) -> S | None:
        """The session with this id, or None."""
        position = self._position(session_id)
        return None if position is None else self._items[position]

    def put(self, session: S) -> SessionTable[S]:
        """A table with ``session`` replacing the one of the same id (or appended)."""
        position = self._position(session.session_id)
        positions = self._positions
        if position is None:
            if positions is not None:
                positions = positions.set(session.session_id, len(self._items))
            return self._make(self._items.append(session), positions)
        return self._make(self._items.set(position, session), positions)

    def put_many(self, sessions: Iterable[S]) -> SessionTable[S]:
        """``put`` of each of ``sessions`` in order, built in one pass (O(k log n) for k)."""
        items = self._items.evolver()
        added: dict[str, int] = {}
        for session in sessions:
            position = added.get(session.session_id)
            if position is None:
                position = self._position(session.session_id)
            if position is None:
                added[session.session_id] = len(items)
                items.append(session)
            else:
                items[position] = session
        if not items.is_dirty():
            return self
        positions = self._positions
        if positions is not None and added:
            positions = positions.update(added)
        return self._make(items.persistent(), positions)

    # --- sequence and value semantics ---------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> S: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[S, ...]: ...

    def __getitem__(self, index: int | slice) -> S | tuple[S, ...]:
        """The session at position ``index``; a slice gives a tuple."""
        if isinstance(index, slice):
            return tuple(self._items[index])
        return self._items[index]

    def __iter__(self) -> Iterator[S]:
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SessionTable):
            return other is self or self._items == other._items
        if isinstance(other, tuple):
            return len(self._items) == len(other) and tuple(self._items) == other
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._items))
        return self._hash

    def __repr__(self) -> str:
        return f"SessionTable({tuple(self._items)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (SessionTable, (tuple(self._items),))
