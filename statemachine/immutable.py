"""Immutable values for the flow state: :func:`replace` and persistent vectors.

**A changed copy.** :func:`replace` makes a new frozen value with some fields changed, at the
cost of those fields only. Every transition builds new :class:`~statemachine.state.FlowState`,
``Checkpoint`` and ``SessionState`` values from old ones, dozens of times per ping/pong.
``attrs.evolve`` does it by calling the class's ``__init__`` with every field: it looks the
fields up again each time and runs every field's converter, though an unchanged field was
converted when its value was first built. :func:`replace` copies the unchanged fields as they
are and runs the converter and validator of the changed fields only, which is what
``attrs.evolve`` produces, for less.

It does so with straight-line code generated once per class and *set of changed fields* (a
transition changes the same few fields each time: ``status`` and ``pending``, say), so a call is
one dictionary lookup and one call of a function that sets each field once, with no loop over
the changes and no per-field checks at run time.

Setting a field of a frozen attrs instance must bypass the class's ``__setattr__`` (which
refuses): ``object.__setattr__(new, name, value)``, a call per field. For a slotted class
without a ``__weakref__`` slot (``@attrs.frozen(weakref_slot=False)``, as the flow state classes
are declared), the new value is instead built as an instance of a *builder*: a plain class with
the very same slots, whose fields are set by ordinary attribute stores (about five times
cheaper), and then given its real class by ``__class__`` assignment, which CPython allows
between classes of identical slot layout. The result is an ordinary frozen instance of the
class. Where the layouts differ (a ``__weakref__`` slot, a base with slots), the replacer falls
back to ``object.__setattr__``.

A class with ``__attrs_post_init__`` or a cached hash goes through ``attrs.evolve`` (the copy
would skip the one and carry a stale other).

**Persistent vectors.** A flow's state is a frozen value and every transition builds a new one.
With plain tuples, changing one of N sessions or appending one of N journal entries copies all N
items: a flow with many sessions (or a long journal) then costs O(N) per message and O(N^2) in
all. The sequences that grow with a flow are therefore pyrsistent's ``PVector`` (a 32-way trie,
in C when pyrsistent's extension is built): reading, replacing or appending one item copies one
path of at most ``log32(N)`` nodes, and the rest is shared with the value it was built from.

The C vector's garbage-collector traversal visits every item, so a young-generation collection
that finds a freshly built vector of N items costs O(N) (docs/architecture.md).

A ``PVector`` equals a list of the same items but not a tuple, and hashes differently from one;
the checkpoint serializer encodes it exactly as the tuple of its items (see
:mod:`persistence.checkpoint_codec`). Sessions live in a
:class:`~statemachine.session_table.SessionTable`, which also indexes them by id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import attrs
from pyrsistent import PVector, pvector

__all__ = ["EMPTY_VECTOR", "VECTOR_TYPE", "replace", "vector_of"]

T = TypeVar("T")

_Replacer = Callable[..., Any]
"""``replacer(old, **changes) -> new`` for one class and one set of changed fields."""

_replacers: dict[tuple[type, tuple[str, ...]], _Replacer] = {}


def _uses_evolve(cls: type) -> bool:
    """True if copying ``cls`` field by field would be wrong (post-init hook, cached hash)."""
    post_init = hasattr(cls, "__attrs_post_init__")
    cached_hash = any(name.endswith("_hash") for name in getattr(cls, "__slots__", ()))
    return post_init or cached_hash or not hasattr(cls, "__slots__")


def _evolver(cls: type) -> _Replacer:
    def evolve(old: Any, **changes: Any) -> Any:
        return attrs.evolve(old, **changes)

    return evolve


_builders: dict[type, type | None] = {}


def _builder(cls: type) -> type | None:
    """A plain class with ``cls``'s slot layout, or None if it cannot have one.

    None when CPython would not let an instance of such a class become a ``cls`` by
    ``__class__`` assignment.
    """
    if cls in _builders:
        return _builders[cls]
    slots: Any = getattr(cls, "__slots__", ())
    builder: type = type(f"{cls.__name__}Builder", (object,), {"__slots__": slots})
    probe: Any = object.__new__(builder)
    try:
        probe.__class__ = cls
    except TypeError:  # another layout (a __weakref__ slot, a base with slots of its own)
        _builders[cls] = None
        return None
    _builders[cls] = builder
    return builder


def _compile(cls: type, names: tuple[str, ...]) -> _Replacer:
    """The replacer of ``cls`` for the changed ``names`` (``__init__`` keywords)."""
    if _uses_evolve(cls):
        return _evolver(cls)
    fields = attrs.fields(cls)
    by_alias = {field.alias: field for field in fields if field.init}
    unknown = [name for name in names if name not in by_alias]
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {unknown[0]!r} to change")
    namespace: dict[str, Any] = {
        "_new": object.__new__,
        "_cls": cls,
        "_set": object.__setattr__,
        "_disabled": attrs.validators.get_disabled,
    }
    changed = {by_alias[name].name: name for name in names}
    builder = _builder(cls)
    namespace["_builder"] = builder
    lines = [f"def replace(old, {', '.join(names)}):" if names else "def replace(old):"]
    lines.append("    new = _new(_cls)" if builder is None else "    new = _new(_builder)")
    for field in fields:
        alias = changed.get(field.name)
        value = f"old.{field.name}" if alias is None else alias
        if alias is not None and field.converter is not None:
            namespace[f"_convert_{field.name}"] = field.converter
            value = f"_convert_{field.name}({alias})"
        if builder is None:
            lines.append(f"    _set(new, {field.name!r}, {value})")
        else:
            lines.append(f"    new.{field.name} = {value}")
    if builder is not None:
        lines.append("    new.__class__ = _cls")
    for field in fields:
        if field.name in changed and field.validator is not None:
            namespace[f"_validate_{field.name}"] = field.validator
            namespace[f"_field_{field.name}"] = field
            lines.append("    if not _disabled():")
            lines.append(
                f"        _validate_{field.name}(new, _field_{field.name}, new.{field.name})"
            )
    lines.append("    return new")
    # The code is made of attrs field names (Python identifiers) only.
    exec("\n".join(lines), namespace)
    replacer: _Replacer = namespace["replace"]
    return replacer


def replace(instance: T, **changes: Any) -> T:
    """``instance`` with ``changes`` (by ``__init__`` keyword), as ``attrs.evolve`` makes it."""
    key = (type(instance), tuple(changes))
    replacer = _replacers.get(key)
    if replacer is None:
        replacer = _replacers[key] = _compile(type(instance), key[1])
    new: T = replacer(instance, **changes)
    return new


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
