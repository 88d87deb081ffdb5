"""Persistent (immutable, structure-sharing) sequences and maps for the frozen flow state.

A flow's state is a frozen value and every transition builds a new one. With plain tuples,
changing one of N sessions or appending one of N journal entries copies all N items: a flow
with many sessions (or a long journal) then costs O(N) per message and O(N^2) in all.
:class:`PVector` and :class:`PMap` are 32-way tries of tuples: reading, replacing or
appending one item copies one path of at most ``log32(N)`` nodes of 32 slots (4 nodes for a
million items), and the rest is shared with the value it was built from.

Both are values: nothing in them ever changes after construction. A :class:`PVector` is
equal to (and hashes like) the tuple of its items, so it can stand wherever a tuple of the
same items was expected, and it is serialized as that tuple.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_BITS = 5
_WIDTH = 1 << _BITS
_MASK = _WIDTH - 1
_HASH_MASK = (1 << 64) - 1

_Node = tuple[Any, ...]


class PVector(Sequence[T]):
    """An immutable sequence with O(log32 n) indexing, replacement and append.

    Items live in leaves of up to 32; inner nodes hold up to 32 children. Every leaf but the
    last is full, so item ``i`` is found by the 5-bit digits of ``i``.
    """

    __slots__ = ("_count", "_hash", "_root", "_shift")

    _count: int
    _shift: int
    _root: _Node
    _hash: int | None

    def __init__(self, items: Iterable[T] = ()) -> None:
        """A vector of ``items``, in order (built in O(n))."""
        leaves: list[_Node] = []
        leaf: list[T] = []
        for item in items:
            leaf.append(item)
            if len(leaf) == _WIDTH:
                leaves.append(tuple(leaf))
                leaf = []
        count = len(leaves) * _WIDTH + len(leaf)
        if leaf or not leaves:
            leaves.append(tuple(leaf))
        level, shift = leaves, 0
        while len(level) > 1:
            level = [tuple(level[i : i + _WIDTH]) for i in range(0, len(level), _WIDTH)]
            shift += _BITS
        self._set_fields(count, shift, level[0])

    def _set_fields(self, count: int, shift: int, root: _Node) -> None:
        self._count, self._shift, self._root, self._hash = count, shift, root, None

    @classmethod
    def _make(cls, count: int, shift: int, root: _Node) -> PVector[T]:
        vector: PVector[T] = cls.__new__(cls)
        vector._set_fields(count, shift, root)
        return vector

    @classmethod
    def of(cls, items: Iterable[T]) -> PVector[T]:
        """``items`` itself if it is already a vector, else a new vector of them."""
        if isinstance(items, PVector):
            return items
        return cls(items)

    # --- reading ----------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def _index(self, index: int) -> int:
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(f"vector index {index} out of range (length {self._count})")
        return index

    def _leaf_for(self, index: int) -> _Node:
        node = self._root
        for shift in range(self._shift, 0, -_BITS):
            node = node[(index >> shift) & _MASK]
        return node

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        """Item ``index``; a slice gives a tuple (O(k log n) for k items)."""
        if isinstance(index, slice):
            return tuple(self._unchecked(i) for i in range(*index.indices(self._count)))
        return self._unchecked(self._index(index))

    def _unchecked(self, index: int) -> T:
        item: T = self._leaf_for(index)[index & _MASK]
        return item

    def _leaves(self, node: _Node, shift: int) -> Iterator[_Node]:
        if shift == 0:
            yield node
            return
        for child in node:
            yield from self._leaves(child, shift - _BITS)

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self._leaves(self._root, self._shift))

    def to_tuple(self) -> tuple[T, ...]:
        """The items as a tuple (O(n))."""
        return tuple(self)

    # --- building new vectors ---------------------------------------------------------

    def set(self, index: int, item: T) -> PVector[T]:
        """A vector with ``item`` at ``index`` (which must exist)."""
        index = self._index(index)
        return self._make(self._count, self._shift, _assoc(self._root, self._shift, index, item))

    def append(self, item: T) -> PVector[T]:
        """A vector with ``item`` added at the end."""
        count, shift, root = self._count, self._shift, self._root
        if count == 1 << (shift + _BITS):  # the trie is full: grow a level
            return self._make(count + 1, shift + _BITS, (root, _path(shift, item)))
        return self._make(count + 1, shift, _push(root, shift, count, item))

    def extend(self, items: Iterable[T]) -> PVector[T]:
        """A vector with ``items`` added at the end."""
        vector = self
        for item in items:
            vector = vector.append(item)
        return vector

    # --- value semantics --------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, PVector):
            return self._count == other._count and self.to_tuple() == other.to_tuple()
        if isinstance(other, tuple):
            return self._count == len(other) and self.to_tuple() == other
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self.to_tuple())
        return self._hash

    def __repr__(self) -> str:
        return f"PVector({self.to_tuple()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (PVector, (self.to_tuple(),))


def _assoc(node: _Node, shift: int, index: int, item: Any) -> _Node:
    slot = (index >> shift) & _MASK
    if shift == 0:
        return (*node[:slot], item, *node[slot + 1 :])
    child = _assoc(node[slot], shift - _BITS, index, item)
    return (*node[:slot], child, *node[slot + 1 :])


def _path(shift: int, item: Any) -> _Node:
    node: _Node = (item,)
    for _ in range(0, shift, _BITS):
        node = (node,)
    return node


def _push(node: _Node, shift: int, index: int, item: Any) -> _Node:
    """``node`` with ``item`` appended as item ``index`` (the first free slot)."""
    if shift == 0:
        return (*node, item)
    slot = (index >> shift) & _MASK
    if slot < len(node):
        return (*node[:slot], _push(node[slot], shift - _BITS, index, item))
    return (*node, _path(shift - _BITS, item))


# --- maps -------------------------------------------------------------------------------


class _Entry:
    """One key and its value, with the key's (masked) hash."""

    __slots__ = ("hash", "key", "value")

    def __init__(self, hash_: int, key: Any, value: Any) -> None:
        self.hash, self.key, self.value = hash_, key, value


class _Bucket:
    """Entries whose keys have the same 64-bit hash (searched one by one)."""

    __slots__ = ("entries", "hash")

    def __init__(self, hash_: int, entries: tuple[_Entry, ...]) -> None:
        self.hash, self.entries = hash_, entries


_EMPTY_NODE: _Node = (None,) * _WIDTH


class PMap(Generic[K, V]):
    """An immutable hash map (a hash array mapped trie) with O(log32 n) get and set.

    Iteration order is not defined: it is for lookups (an index), not for storing.
    """

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        """The empty map."""
        self._count = 0
        self._root: _Node = _EMPTY_NODE

    def __len__(self) -> int:
        return self._count

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default``."""
        hash_ = hash(key) & _HASH_MASK
        node, shift = self._root, 0
        while True:
            slot = node[(hash_ >> shift) & _MASK]
            if slot is None:
                return default
            if type(slot) is tuple:
                node, shift = slot, shift + _BITS
                continue
            if type(slot) is _Entry:
                if slot.key == key:
                    value: V = slot.value
                    return value
                return default
            for entry in slot.entries:
                if entry.key == key:
                    found: V = entry.value
                    return found
            return default

    def __contains__(self, key: K) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def set(self, key: K, value: V) -> PMap[K, V]:
        """A map with ``key`` bound to ``value``."""
        entry = _Entry(hash(key) & _HASH_MASK, key, value)
        root, added = _insert(self._root, 0, entry)
        result: PMap[K, V] = PMap.__new__(PMap)
        result._root = root
        result._count = self._count + added
        return result

    def __iter__(self) -> Iterator[K]:
        stack: list[_Node] = [self._root]
        while stack:
            for slot in stack.pop():
                if slot is None:
                    continue
                if type(slot) is tuple:
                    stack.append(slot)
                elif type(slot) is _Entry:
                    yield slot.key
                else:
                    yield from (entry.key for entry in slot.entries)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PMap):
            return NotImplemented
        if other is self:
            return True
        return len(self) == len(other) and all(
            other.get(key, _MISSING) == self.get(key) for key in self
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PMap({ {key: self.get(key) for key in self}!r})"


_MISSING: Any = object()


def _insert(node: _Node, shift: int, entry: _Entry) -> tuple[_Node, int]:
    """``node`` with ``entry`` in it, and 1 if its key was new (0 if it replaced one)."""
    slot_index = (entry.hash >> shift) & _MASK
    slot = node[slot_index]
    added = 1
    new: Any
    if slot is None:
        new = entry
    elif type(slot) is tuple:
        new, added = _insert(slot, shift + _BITS, entry)
    elif slot.hash != entry.hash:  # an entry or bucket of another hash: split them
        new = _split(slot, entry, shift + _BITS)
    elif type(slot) is _Entry:
        if slot.key == entry.key:
            new, added = entry, 0
        else:
            new = _Bucket(entry.hash, (slot, entry))
    else:
        kept = tuple(e for e in slot.entries if e.key != entry.key)
        added = int(len(kept) == len(slot.entries))
        new = _Bucket(entry.hash, (*kept, entry))
    return (*node[:slot_index], new, *node[slot_index + 1 :]), added


def _split(old: _Entry | _Bucket, entry: _Entry, shift: int) -> _Node:
    """A node holding ``old`` and ``entry`` (their hashes differ), as deep as needed."""
    old_index = (old.hash >> shift) & _MASK
    new_index = (entry.hash >> shift) & _MASK
    if old_index == new_index:
        child = _split(old, entry, shift + _BITS)
        return (*_EMPTY_NODE[:old_index], child, *_EMPTY_NODE[old_index + 1 :])
    node = list(_EMPTY_NODE)
    node[old_index], node[new_index] = old, entry
    return tuple(node)


EMPTY_MAP: PMap[Any, Any] = PMap()
"""The empty map (shared)."""
