"""msgpack serialization with an allow-list of types.

A :class:`Serializer` encodes ``None``, ``bool``, ``int`` (of any size), ``float``, ``str``,
``bytes``, ``list``, ``tuple``, ``dict``, enum members and instances of the attrs classes
registered in its :class:`TypeRegistry`. Anything else is refused at encoding time with an
error naming the type and where it was found. Decoding never constructs a type that is not
registered: an unknown type name in the data is an error, not an import.

Three registries are used in fiberflow: ``PAYLOAD_TYPES`` (what flows may send and take as
arguments: ``Party`` plus classes marked ``@serializable``), and the internal ones for
checkpoints and wire messages (see :mod:`persistence.checkpoint_codec` and
:mod:`messaging.codec`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Union

import attrs
import msgpack

EXT_TUPLE = 1
EXT_OBJECT = 2
EXT_ENUM = 3
EXT_BIG_INT = 4

_MSGPACK_INT_RANGE = (-(2**63), 2**64 - 1)
_MSGPACK_LIMIT_RULES = {
    "max_str_len": "max_string_length",
    "max_bin_len": "max_bytes_length",
    "max_array_len": "max_collection_length",
    "max_map_len": "max_collection_length",
    "max_ext_len": "max_bytes",
}

_SCALARS = frozenset({type(None), bool, int, float, bytes})
"""Decoded types with nothing inside to check (strings have a length limit)."""

MAX_DEPTH = 64
"""Deepest nesting accepted by default (deeper data is refused, never truncated)."""


@attrs.frozen
class SerializationLimits:
    """What a serializer accepts, both ways; data over a limit is refused naming the rule."""

    max_bytes: int = 16 * 1024 * 1024
    """Size of the encoded value."""
    max_depth: int = MAX_DEPTH
    """Nesting of lists, tuples, dicts and objects."""
    max_collection_length: int = 100_000
    """Items in one list, tuple or dict."""
    max_string_length: int = 4 * 1024 * 1024
    """Characters in one string (bytes of its UTF-8 form when decoding)."""
    max_bytes_length: int = 16 * 1024 * 1024
    """Bytes in one ``bytes`` value."""

    def __attrs_post_init__(self) -> None:
        for field in attrs.fields(type(self)):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"serialization limit {field.name} must be a positive int")


DEFAULT_LIMITS = SerializationLimits()


class SerializationError(ValueError):
    """A value could not be encoded (type not allowed) or decoded (bad or unregistered data)."""


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class: how registries and checkpoints name types."""
    return f"{cls.__module__}.{cls.__qualname__}"


class TypeRegistry:
    """The classes a serializer may encode and construct, by qualified name."""

    def __init__(self, classes: Iterable[type] = ()) -> None:
        self._by_name: dict[str, type] = {}
        for cls in classes:
            self.register(cls)

    def register(self, cls: type) -> type:
        """Allow ``cls`` (an attrs class or an Enum); returns it, so it works as a decorator."""
        if not (attrs.has(cls) or issubclass(cls, enum.Enum)):
            raise TypeError(
                f"{qualified_name(cls)} cannot be registered for serialization: only attrs "
                "classes and enums can (decorate it with @attrs.frozen first)"
            )
        name = qualified_name(cls)
        existing = self._by_name.get(name)
        if existing is not None and existing is not cls:
            raise TypeError(f"another class is already registered as {name}")
        self._by_name[name] = cls
        return cls

    def lookup(self, name: str) -> type | None:
        """The registered class called ``name``, or None."""
        return self._by_name.get(name)

    def allows(self, cls: type) -> bool:
        """True if instances of ``cls`` may be encoded."""
        return self._by_name.get(qualified_name(cls)) is cls

    def allows_named(self, cls: type, name: str) -> bool:
        """:meth:`allows`, for a ``cls`` whose qualified name the caller knows already."""
        return self._by_name.get(name) is cls

    def names(self) -> list[str]:
        """Sorted names of the registered classes."""
        return sorted(self._by_name)


Path = Union[str, tuple[Any, str, Any]]
"""Where a value is in what is being encoded: the root's name, or (parent, step, key)."""


def _text(path: Path) -> str:
    """A path as the error messages write it: ``value.items[2]``, ``value['k']``, ``value key``."""
    steps: list[str] = []
    while isinstance(path, tuple):
        path, step, key = path
        if step == "[":
            steps.append(f"[{key}]")
        elif step == "[r":
            steps.append(f"[{key!r}]")
        elif step == ".":
            steps.append(f".{key}")
        else:
            steps.append(step)
    return path + "".join(reversed(steps))


OMIT_DEFAULT = "fiberflow.omit_default"
"""attrs field metadata: a trailing field left out of the encoding while it holds its default
(``attrs.field(default=0, metadata={OMIT_DEFAULT: True})``); decoding fills the default in."""


@attrs.frozen
class _ObjectPlan:
    """How instances of one class are encoded: its qualified name, and its init fields."""

    name: str
    is_enum: bool
    fields: tuple[str, ...] | None
    """The attrs ``__init__`` fields in order (None: not an attrs class)."""
    omitted_defaults: tuple[tuple[str, Any], ...] = ()
    """Trailing fields marked ``OMIT_DEFAULT`` in their metadata, with their defaults: left
    out of the encoding while they hold it (a field added to a class keeps the old bytes)."""

    @classmethod
    def of(cls, kind: type) -> _ObjectPlan:
        """The plan of ``kind`` (computed once per class by each serializer)."""
        fields = None
        omitted: list[tuple[str, Any]] = []
        if attrs.has(kind):
            init = [f for f in attrs.fields(kind) if f.init]
            fields = tuple(f.name for f in init)
            for field in reversed(init):
                if not field.metadata.get(OMIT_DEFAULT):
                    break
                omitted.insert(0, (field.name, field.default))
        return cls(qualified_name(kind), issubclass(kind, enum.Enum), fields, tuple(omitted))


class Serializer:
    """Encodes and decodes values restricted to the types its registry allows."""

    def __init__(
        self,
        registry: TypeRegistry,
        what: str = "value",
        limits: SerializationLimits = DEFAULT_LIMITS,
        tuple_types: Iterable[type] = (),
    ) -> None:
        """A serializer of the types ``registry`` allows, and of ``tuple_types``.

        ``tuple_types`` are immutable sequence types encoded exactly as the tuple of their
        items (they decode as tuples: the classes holding them convert them back).
        """
        self.registry = registry
        self.what = what
        self._limits = limits
        self._tuple_types = frozenset(tuple_types)
        self._plans: dict[type, _ObjectPlan] = {}

    @property
    def limits(self) -> SerializationLimits:
        """What this serializer accepts, both ways (fixed when it is made)."""
        return self._limits

    def with_limits(self, limits: SerializationLimits) -> Serializer:
        """A serializer of the same types within other ``limits`` (a node's, say).

        It shares this one's registry: a class registered later is allowed by both.
        """
        return Serializer(self.registry, self.what, limits, self._tuple_types)

    def _broken(self, rule: str, detail: str, encoding: bool) -> SerializationError:
        verb = "serialize" if encoding else "deserialize"
        limit = getattr(self._limits, rule)
        return SerializationError(
            f"cannot {verb} {self.what}: it breaks the rule {rule} ({limit}): {detail}"
        )

    def encode(self, value: Any) -> bytes:
        """Serialize ``value``; raises :class:`SerializationError` naming a disallowed type."""
        try:
            packed = self._pack(self._to_plain(value, 0, "value"))
        except SerializationError:
            raise
        except (TypeError, ValueError, OverflowError) as error:
            raise SerializationError(f"cannot serialize {self.what}: {error}") from error
        if len(packed) > self._limits.max_bytes:
            raise self._broken("max_bytes", f"{len(packed)} bytes encoded", True)
        return packed

    def decode(self, data: bytes) -> Any:
        """Deserialize bytes made by :meth:`encode`; never constructs an unregistered type."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise SerializationError(f"cannot deserialize {self.what}: not bytes")
        if len(data) > self._limits.max_bytes:
            raise self._broken("max_bytes", f"{len(data)} bytes received", False)
        try:
            value = self._unpack(bytes(data))
        except SerializationError:
            raise
        except ValueError as error:
            text = str(error)
            for option, rule in _MSGPACK_LIMIT_RULES.items():
                if option in text:
                    raise self._broken(rule, text, False) from None
            if "recursion limit" in text:
                raise self._broken("max_depth", text, False) from None
            raise SerializationError(f"cannot deserialize {self.what}: {error}") from error
        except Exception as error:  # msgpack raises several unrelated exception types
            raise SerializationError(f"cannot deserialize {self.what}: {error}") from error
        self._check_depth(value)
        return value

    def _unpack(self, data: bytes) -> Any:
        limits = self._limits
        return msgpack.unpackb(
            data,
            ext_hook=self._ext_hook,
            raw=False,
            strict_map_key=False,
            use_list=True,
            max_str_len=limits.max_string_length * 4,  # UTF-8 takes up to 4 bytes a character
            max_bin_len=limits.max_bytes_length,
            max_array_len=limits.max_collection_length,
            max_map_len=limits.max_collection_length,
            max_ext_len=limits.max_bytes,
        )

    def _check_depth(self, value: Any) -> None:
        """Refuse decoded data nested deeper than the limit (walks it without recursion)."""
        kind = type(value)
        if kind in _SCALARS:  # most payloads: nothing to walk
            return
        if kind is str:
            self._check_string(value)
            return
        stack: list[tuple[Any, int]] = [(value, 0)]
        limit = self._limits.max_depth
        while stack:
            item, depth = stack.pop()
            if depth > limit:
                raise self._broken("max_depth", f"nested {depth} deep", False)
            kind = type(item)
            if kind in _SCALARS:
                continue
            if kind is str:
                self._check_string(item)
            elif isinstance(item, list | tuple):
                stack.extend((child, depth + 1) for child in item)
            elif isinstance(item, dict):
                stack.extend((child, depth + 1) for child in item.values())
            elif attrs.has(kind):
                stack.extend((getattr(item, f.name), depth + 1) for f in attrs.fields(kind))
            elif isinstance(item, str):
                self._check_string(item)

    def _check_string(self, text: str) -> None:
        if len(text) > self._limits.max_string_length:
            raise self._broken("max_string_length", f"{len(text)} characters", False)

    def _to_plain(self, value: Any, depth: int, path: Path) -> Any:
        """``value`` as msgpack can take it: registered types as extension values.

        ``path`` says where ``value`` is (for error messages only: it is rendered as text,
        e.g. ``value.items[2]``, only when something is refused).
        """
        limits = self._limits
        if depth > limits.max_depth:
            raise self._broken(
                "max_depth", f"nested deeper than {limits.max_depth} at {_text(path)}", True
            )
        kind = type(value)
        if kind is str:
            if len(value) > limits.max_string_length:
                raise self._broken(
                    "max_string_length", f"{len(value)} characters at {_text(path)}", True
                )
            return value
        if kind is int:
            if not _MSGPACK_INT_RANGE[0] <= value <= _MSGPACK_INT_RANGE[1]:
                size = (value.bit_length() + 8) // 8
                return msgpack.ExtType(EXT_BIG_INT, value.to_bytes(size, "big", signed=True))
            return value
        if kind is bytes:
            if len(value) > limits.max_bytes_length:
                raise self._broken("max_bytes_length", f"{len(value)} bytes at {_text(path)}", True)
            return value
        if value is None or kind is bool or kind is float:
            return value
        if kind in self._tuple_types:
            value = tuple(value)
            kind = tuple
        if kind is list or kind is tuple or kind is dict:
            if len(value) > limits.max_collection_length:
                raise self._broken(
                    "max_collection_length", f"{len(value)} items at {_text(path)}", True
                )
            deeper = depth + 1
            if kind is dict:
                return {
                    self._to_plain(k, deeper, (path, " key", None)): self._to_plain(
                        v, deeper, (path, "[r", k)
                    )
                    for k, v in value.items()
                }
            items = [self._to_plain(v, deeper, (path, "[", i)) for i, v in enumerate(value)]
            if kind is list:
                return items
            return msgpack.ExtType(EXT_TUPLE, self._pack(items))
        plan = self._plans.get(kind)
        if plan is None:
            plan = _ObjectPlan.of(kind)
            self._plans[kind] = plan
        if plan.is_enum and self.registry.allows_named(kind, plan.name):
            return msgpack.ExtType(EXT_ENUM, self._pack([plan.name, value.value]))
        if plan.fields is not None and self.registry.allows_named(kind, plan.name):
            deeper = depth + 1
            names = plan.fields
            for name, default in reversed(plan.omitted_defaults):
                if getattr(value, name) != default:
                    break
                names = names[:-1]
            fields = [
                self._to_plain(getattr(value, name), deeper, (path, ".", name)) for name in names
            ]
            return msgpack.ExtType(EXT_OBJECT, self._pack([plan.name, fields]))
        raise SerializationError(
            f"cannot serialize {self.what}: {_text(path)} is a {plan.name}, which is not "
            "allowed (allowed: None, bool, int, float, str, bytes, list, tuple, dict and "
            "registered classes; register an attrs class with @flows.serializable)"
        )

    @staticmethod
    def _pack(items: Any) -> bytes:
        packed: bytes = msgpack.packb(items, use_bin_type=True)
        return packed

    def _ext_hook(self, code: int, data: bytes) -> Any:
        if code == EXT_BIG_INT:
            return int.from_bytes(data, "big", signed=True)
        items = self._unpack(data)
        if code == EXT_TUPLE:
            return tuple(items)
        if code in (EXT_OBJECT, EXT_ENUM):
            name, body = items
            cls = self.registry.lookup(name) if isinstance(name, str) else None
            if cls is None:
                raise SerializationError(
                    f"cannot deserialize {self.what}: type {name!r} is not registered"
                )
            if code == EXT_ENUM:
                return cls(body)
            return cls(*body)
        raise SerializationError(f"cannot deserialize {self.what}: unknown extension {code}")


PAYLOAD_TYPES = TypeRegistry()
"""Classes flows may send, receive, return and take as arguments (``@flows.serializable``)."""

PAYLOADS = Serializer(PAYLOAD_TYPES, "payload")
"""The serializer for flow payloads, arguments and results, within the default limits.

A node serializes its flows' payloads with ``PAYLOADS.with_limits(config.limits)``."""
