"""A checkpoint's sessions: an ordered, immutable table looked up by session id.

Sessions are kept in the order the flow came to have them (that order is what a checkpoint
stores) in a :class:`~statemachine.persistent.PVector`, beside a
:class:`~statemachine.persistent.PMap` from session id to position. Looking up, replacing or
adding one session costs O(log32 n); replacing many at once is built in one pass. A session
never leaves the table and never moves, so the index is only ever added to.

The table compares equal to (and is serialized as) the tuple of its sessions; the index is
derived and takes no part in equality.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar, overload

from statemachine.persistent import EMPTY_MAP, PMap, PVector


class HasSessionId(Protocol):
    """What the table keeps: values with a ``session_id``."""

    @property
    def session_id(self) -> str:
        """The key of the value in the table."""


S = TypeVar("S", bound=HasSessionId)

_BULK_FRACTION = 8
"""Replacing more than 1/8 of the sessions at once rebuilds the vector in one pass."""


class SessionTable(Sequence[S], Generic[S]):
    """Sessions in order, with O(log n) lookup, replacement and append by session id."""

    __slots__ = ("_items", "_positions")

    _items: PVector[S]
    _positions: PMap[str, int]

    def __init__(self, sessions: Iterable[S] = ()) -> None:
        """A table of ``sessions`` in order; a later session with the same id replaces one."""
        items: list[S] = []
        positions: PMap[str, int] = EMPTY_MAP
        for session in sessions:
            position = positions.get(session.session_id)
            if position is None:
                positions = positions.set(session.session_id, len(items))
                items.append(session)
            else:
                items[position] = session
        self._items, self._positions = PVector(items), positions

    @classmethod
    def of(cls, sessions: Iterable[S]) -> SessionTable[S]:
        """``sessions`` itself if it is already a table, else a new table of them."""
        if isinstance(sessions, SessionTable):
            return sessions
        return cls(sessions)

    @classmethod
    def _make(cls, items: PVector[S], positions: PMap[str, int]) -> SessionTable[S]:
        table: SessionTable[S] = cls.__new__(cls)
        table._items, table._positions = items, positions
        return table

    def get(self, session_id: str) -> S | None:
        """The session with this id, or None."""
        position = self._positions.get(session_id)
        return None if position is None else self._items[position]

    def put(self, session: S) -> SessionTable[S]:
        """A table with ``session`` replacing the one of the same id (or appended)."""
        position = self._positions.get(session.session_id)
        if position is None:
            positions = self._positions.set(session.session_id, len(self._items))
            return self._make(self._items.append(session), positions)
        return self._make(self._items.set(position, session), self._positions)

    def put_many(self, sessions: Iterable[S]) -> SessionTable[S]:
        """``put`` of each of ``sessions`` in order, built in one pass when they are many."""
        updates = list(sessions)
        if len(updates) * _BULK_FRACTION <= len(self._items):
            table = self
            for session in updates:
                table = table.put(session)
            return table
        items = list(self._items)
        positions = self._positions
        for session in updates:
            position = positions.get(session.session_id)
            if position is None:
                positions = positions.set(session.session_id, len(items))
                items.append(session)
            else:
                items[position] = session
        return self._make(PVector(items), positions)

    # --- sequence and value semantics ---------------------------------------------------

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> S: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[S, ...]: ...

    def __getitem__(self, index: int | slice) -> S | tuple[S, ...]:
        """The session at position ``index``; a slice gives a tuple."""
        return self._items[index]

    def __iter__(self) -> Iterator[S]:
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SessionTable):
            return self._items == other._items
        if isinstance(other, tuple | PVector):
            return self._items == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"SessionTable({self._items.to_tuple()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (SessionTable, (self._items.to_tuple(),))
