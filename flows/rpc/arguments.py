"""A flow instance from its class and JSON arguments, checked against the constructor.

A client names each constructor argument (``{"recipient": "O=Bob,L=New York,C=US"}``). The
constructor's annotations say what each may be; supported:

* ``str``, ``int`` (not a boolean), ``float`` (an integer too), ``bool``, ``None``;
* ``Party``: given as the party's X.500 name;
* ``list[T]``, ``tuple[T, ...]``, ``dict[str, T]`` of those, ``T | None`` and unions of them;
* ``Any``, ``object`` or no annotation: the JSON value as it is (str, number, bool, null,
  list, dict).

Anything else (an argument of another class, ``*args``) cannot be given over the API: the
start is refused naming the argument. The arguments are passed by name in the
constructor's order, so the same request always encodes to the same bytes (idempotent
starts compare them).
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

from flows.errors import FlowArgumentError
from flows.flow_logic import FlowLogic
from flows.node.flow_requests import encode_arguments
from flows.party import Party


class ArgumentError(ValueError):
    """The arguments do not build the flow; the message names the argument (HTTP 400)."""


def build_flow(
    cls: type[FlowLogic[Any]], arguments: dict[str, Any]
) -> tuple[FlowLogic[Any], bytes]:
    """The flow ``cls(**arguments)`` with converted arguments, and its encoded arguments.

    Raises :class:`ArgumentError` for an unknown or missing argument, a value of the wrong
    type, an argument type the API cannot build, a constructor that refuses the values, or
    arguments that cannot be checkpointed.
    """
    name = cls.__qualname__
    try:
        signature = inspect.signature(cls.__init__)
        hints = typing.get_type_hints(cls.__init__)
    except (TypeError, ValueError, NameError) as error:
        raise ArgumentError(f"{name}: cannot read its constructor's signature: {error}") from None
    parameters = list(signature.parameters.values())[1:]  # past self
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.POSITIONAL_ONLY):
            raise ArgumentError(
                f"{name}: its constructor takes positional-only or *args arguments, which the "
                "API cannot pass by name"
            )
    named = {p.name: p for p in parameters if p.kind != p.VAR_KEYWORD}
    unknown = sorted(set(arguments) - set(named))
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in parameters):
        raise ArgumentError(
            f"{name}: unknown argument {unknown[0]!r} (it takes: {', '.join(named) or 'none'})"
        )
    if unknown:
        raise ArgumentError(
            f"{name}: argument {unknown[0]!r}: **kwargs cannot be given over the API"
        )
    kwargs: dict[str, Any] = {}
    for parameter in named.values():
        if parameter.name not in arguments:
            if parameter.default is parameter.empty:
                raise ArgumentError(f"{name}: argument {parameter.name!r} is missing")
            continue
        annotation = hints.get(parameter.name, Any)
        kwargs[parameter.name] = convert(arguments[parameter.name], annotation, parameter.name)
    try:
        flow = cls(**kwargs)
    except Exception as error:
        raise ArgumentError(
            f"{name}: the arguments do not build the flow: {type(error).__name__}: {error}"
        ) from None
    try:
        encoded = encode_arguments(flow)
    except FlowArgumentError as error:
        raise ArgumentError(str(error)) from None
    return flow, encoded


def convert(value: Any, annotation: Any, where: str) -> Any:
    """``value`` (from JSON) as ``annotation`` says; ArgumentError naming ``where`` if not."""
    if annotation is Any or annotation is object:
        return value
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        problems = []
        for option in arguments:
            try:
                return convert(value, option, where)
            except ArgumentError as error:
                problems.append(str(error))
        raise ArgumentError(
            f"argument {where!r}: {_json_type(value)} is none of {_names(arguments)}"
        )
    if annotation is None or annotation is type(None):
        if value is None:
            return None
        raise _wrong(where, "null", value)
    if annotation is Party:
        if not isinstance(value, str):
            raise _wrong(where, "a party's X.500 name (a string)", value)
        try:
            return Party(value)
        except ValueError as error:
            raise ArgumentError(f"argument {where!r}: not a party's name: {error}") from None
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise _wrong(where, "a boolean", value)
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _wrong(where, "an integer", value)
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _wrong(where, "a number", value)
    if annotation is str:
        if isinstance(value, str):
            return value
        raise _wrong(where, "a string", value)
    if origin in (list, tuple) or annotation in (list, tuple):
        if not isinstance(value, list):
            raise _wrong(where, "a list", value)
        if origin is tuple and arguments and arguments[-1] is not Ellipsis:
            if len(arguments) != len(value):
                raise ArgumentError(
                    f"argument {where!r}: needs {len(arguments)} items, not {len(value)}"
                )
            items = [
                convert(v, t, f"{where}[{i}]")
                for i, (v, t) in enumerate(zip(value, arguments, strict=True))
            ]
        else:
            item = arguments[0] if arguments else Any
            items = [convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if (origin or annotation) is tuple else items
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        key_type = arguments[0] if arguments else str
        if key_type not in (str, Any):
            raise ArgumentError(f"argument {where!r}: only dicts with string keys can be given")
        item = arguments[1] if arguments else Any
        return {k: convert(v, item, f"{where}[{k!r}]") for k, v in value.items()}
    raise ArgumentError(
        f"argument {where!r}: its type {_names((annotation,))} cannot be given over the API"
    )


def _names(annotations: tuple[Any, ...]) -> str:
    return " or ".join(getattr(a, "__name__", None) or str(a) for a in annotations)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _wrong(where: str, expected: str, value: Any) -> ArgumentError:
    return ArgumentError(f"argument {where!r}: must be {expected}, not {_json_type(value)}")
