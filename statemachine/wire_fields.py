"""The rules a session message's fields obey, declared on the message classes themselves.

A part of a session message (the messages, their bodies, :class:`~statemachine.flow_error.
FlowError`) is a frozen attrs class deriving from :class:`WirePart`. Each field's annotation
is its whole rule: its type, and for text and numbers their bounds, written once with
``typing.Annotated``::

    recipient_session_id: Annotated[str, Text(SESSION_ID_CHARS)]
    sequence: Annotated[int, Range(0, MAX_SEQUENCE)]
    body: SessionBody

:meth:`WirePart.validate` checks a value against its class's rules, and those of the parts it
holds: every field has its declared type (a ``bool`` is never an ``int``), every text field
holds 1 (0 where it may be empty) to ``limit`` characters and no NUL character, every ranged
number is within its range. The codec (:mod:`messaging.codec`) calls it on what it decodes
from a peer, so nothing malformed gets past the door; a text field without a limit is refused
when the class's rules are first read (the codec reads them all at import).

Constructing a part does not validate it: flow code never builds these (the state machine
does, from values it checked or made), and a test must be able to build the malformed
messages a hostile peer would send.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Union, cast

import attrs

from statemachine.limits import text_problem

__all__ = ["FieldRule", "InvalidFieldError", "Range", "Text", "WirePart", "field_rules"]


class InvalidFieldError(ValueError):
    """A session message part breaks a field rule; the message names the field and the rule."""


@attrs.frozen
class Text:
    """A text field's bounds: at most ``limit`` characters, none of them NUL."""

    limit: int
    may_be_empty: bool = False
    """False for ids and class names, which must say something."""


@attrs.frozen
class Range:
    """An integer field's bounds, both inclusive."""

    low: int
    high: int


@attrs.frozen
class FieldRule:
    """One field's rule, as read from its annotation."""

    name: str
    types: tuple[type, ...]
    """The types a value may have (``NoneType`` for an optional field)."""
    text: Text | None = None
    range: Range | None = None


def _types_of(hint: Any) -> tuple[type, ...]:
    """The classes a (resolved) annotation allows: ``X``, ``X | Y`` or ``Union[X, Y]``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return tuple(t for arg in typing.get_args(hint) for t in _types_of(arg))
    if hint is None:
        return (type(None),)
    if isinstance(hint, type):
        return (hint,)
    raise TypeError(f"a wire field's type must be a class or a union of classes, not {hint!r}")


_RULES: dict[type, tuple[FieldRule, ...]] = {}
"""Rules already read, by class (a class's annotations do not change once it is made)."""


def field_rules(cls: type) -> tuple[FieldRule, ...]:
    """The rules of ``cls``'s fields, in field order, read from its annotations (once)."""
    known = _RULES.get(cls)
    if known is None:
        known = _RULES[cls] = _read_rules(cls)
    return known


def _read_rules(cls: type) -> tuple[FieldRule, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    rules = []
    for field in attrs.fields(cls):
        hint = hints[field.name]
        text = bound = None
        if typing.get_origin(hint) is Annotated:
            hint, *extras = typing.get_args(hint)
            text = next((e for e in extras if isinstance(e, Text)), None)
            bound = next((e for e in extras if isinstance(e, Range)), None)
        allowed = _types_of(hint)
        if str in allowed and text is None:
            raise TypeError(
                f"{cls.__qualname__}.{field.name} is text from outside: annotate it "
                f"Annotated[str, Text(<limit from statemachine.limits>)]"
            )
        rules.append(FieldRule(field.name, allowed, text, bound))
    return tuple(rules)


def _check(value: WirePart, path: str) -> None:
    for rule in field_rules(type(value)):
        item = getattr(value, rule.name)
        if isinstance(item, bool) or not isinstance(item, rule.types):
            names = " or ".join(t.__name__ for t in rule.types)
            raise InvalidFieldError(
                f"{path}.{rule.name} must be {names}, not {type(item).__name__}"
            )
        if rule.text is not None and isinstance(item, str):
            problem = text_problem(
                rule.name, item, rule.text.limit, may_be_empty=rule.text.may_be_empty
            )
            if problem is not None:
                raise InvalidFieldError(f"{path}: {problem}")
        elif rule.range is not None and not rule.range.low <= cast(int, item) <= rule.range.high:
            raise InvalidFieldError(
                f"{path}: field {rule.name} is {item}, out of range "
                f"{rule.range.low}..{rule.range.high}"
            )
        elif isinstance(item, WirePart):
            _check(item, f"{path}.{rule.name}")


_FAST: dict[type, Any] = {}
"""Compiled checks by class (see :func:`_fast_check`)."""


def _fast_check(cls: type) -> Any:
    """A function telling whether an instance of ``cls`` keeps every rule.

    It answers as :func:`_check` would (for the parts it holds too), in straight-line code
    made once per class. It only answers yes or no, and says no to anything unusual (a
    subclass of a field's type, say); :meth:`WirePart.validate` then runs :func:`_check`,
    which names the broken rule (or accepts the unusual value). A message from a peer is
    checked in one call per part.
    """
    known = _FAST.get(cls)
    if known is not None:
        return known
    namespace: dict[str, Any] = {"_FAST": _FAST, "_fast_check": _fast_check}
    lines = ["def ok(value):"]
    for rule in field_rules(cls):
        allowed = frozenset(rule.types)
        namespace[f"_types_{rule.name}"] = allowed
        lines.append(f"    item = value.{rule.name}")
        lines.append("    kind = type(item)")
        lines.append(f"    if kind not in _types_{rule.name} or kind is bool:")
        lines.append("        return False")
        if rule.text is not None:
            shortest = 0 if rule.text.may_be_empty else 1
            lines.append("    if kind is str and not (")
            lines.append(
                f"        {shortest} <= len(item) <= {rule.text.limit} and '\\x00' not in item"
            )
            lines.append("    ):")
            lines.append("        return False")
        elif rule.range is not None:
            lines.append(f"    if not {rule.range.low} <= item <= {rule.range.high}:")
            lines.append("        return False")
        elif any(issubclass(kind, WirePart) for kind in rule.types):
            lines.append("    if isinstance(item, WirePart):")
            lines.append("        check = _FAST.get(kind) or _fast_check(kind)")
            lines.append("        if not check(item):")
            lines.append("            return False")
    lines.append("    return True")
    namespace["WirePart"] = WirePart
    # The code is made of field names (identifiers) and numbers read from the annotations.
    exec("\n".join(lines), namespace)
    checker = namespace["ok"]
    _FAST[cls] = checker
    return checker


class WirePart:
    """Base of every session message part: it validates itself (see the module docstring)."""

    __slots__ = ()

    def validate(self) -> None:
        """Raise :class:`InvalidFieldError` naming the first field that breaks its rule."""
        cls = type(self)
        check = _FAST.get(cls) or _fast_check(cls)
        if not check(self):
            _check(self, cls.__name__)
