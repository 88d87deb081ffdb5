"""``replace``: a new frozen value with some fields changed, at the cost of those fields only.

Every transition builds new :class:`~statemachine.state.FlowState`, ``Checkpoint`` and
``SessionState`` values from old ones, about 80 times per ping/pong. ``attrs.evolve`` does it
by calling the class's ``__init__`` with every field: it looks the fields up again each time
and runs every field's converter, though an unchanged field was converted when its value was
first built. :func:`replace` copies the unchanged fields as they are and runs the converter
and validator of the changed fields only, which is what ``attrs.evolve`` produces, for less.

A class with ``__attrs_post_init__`` or a cached hash goes through ``attrs.evolve`` (the copy
would skip the one and carry a stale other).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

__all__ = ["replace"]

T = TypeVar("T")

_set = object.__setattr__


@attrs.frozen
class _Plan:
    """How to copy one attrs class: its fields, and what a changed field must go through."""

    copy: Callable[[Any], Any] | None
    """Makes a new instance with every field of the given one (None: use ``attrs.evolve``,
    the class has a post-init hook or a cached hash)."""
    by_alias: dict[str, attrs.Attribute[Any]]
    """The ``__init__`` fields by the keyword that sets them."""


_plans: dict[type, _Plan] = {}


def _plan_of(cls: type) -> _Plan:
    fields = attrs.fields(cls)
    post_init = hasattr(cls, "__attrs_post_init__")
    cached_hash = any(name.endswith("_hash") for name in getattr(cls, "__slots__", ()))
    copy = None
    if not post_init and not cached_hash and hasattr(cls, "__slots__"):
        # Straight-line code, one statement per field, as attrs writes its own methods.
        lines = ["def copy(old):", "    new = _new(_cls)"]
        lines += [f"    _set(new, {field.name!r}, old.{field.name})" for field in fields]
        lines.append("    return new")
        namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_set": _set}
        exec("\n".join(lines), namespace)  # the code is made of field names only
        copy = namespace["copy"]
    plan = _Plan(copy, {field.alias: field for field in fields if field.init})
    _plans[cls] = plan
    return plan


def replace(instance: T, **changes: Any) -> T:
    """``instance`` with ``changes`` (by ``__init__`` keyword), as ``attrs.evolve`` makes it."""
    cls = type(instance)
    plan = _plans.get(cls) or _plan_of(cls)
    if plan.copy is None:
        return attrs.evolve(instance, **changes)  # type: ignore[misc]
    new: T = plan.copy(instance)
    for alias, value in changes.items():
        field = plan.by_alias.get(alias)
        if field is None:
            raise TypeError(f"{cls.__name__} has no field {alias!r} to change")
        converter: Callable[[Any], Any] | None = field.converter  # type: ignore[assignment]
        if converter is not None:
            value = converter(value)
        _set(new, field.name, value)
        if field.validator is not None and not attrs.validators.get_disabled():
            field.validator(new, field, value)
    return new
