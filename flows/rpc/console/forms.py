"""Form bodies, and the start form: one field per constructor argument of a flow class.

A field's text is the argument as the HTTP API takes it in JSON, except for ``str`` and
``Party`` arguments (and those ``| None``), which are plain text: a party is its X.500
name. Everything else (numbers, ``true``/``false``, lists, objects) is written as JSON. An
empty field leaves the argument out, so its default applies (or the start is refused as
missing one). :func:`flows.rpc.arguments.build_flow` then checks and converts the values
exactly as for an API start.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
import urllib.parse
from typing import Any

import attrs

from flows.flow_logic import FlowLogic
from flows.party import Party
from flows.rpc.arguments import ArgumentError

FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FIELDS = 200
"""The most fields a form body may have."""
ARGUMENT_PREFIX = "arg."
"""Start form fields holding arguments are named ``arg.<argument name>``."""

_TEXT_TYPES = (str, Party)


class FormError(ValueError):
    """A form body the console cannot read (HTTP 400 or 413)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@attrs.frozen
class ArgumentField:
    """One argument of a flow's constructor, as the start form shows it."""

    name: str
    annotation: str
    """The annotation as written in the code, for the form's label."""
    text: bool
    """True: the field's text is the value (str, Party); False: it is JSON."""
    default: str | None
    """The default's repr, or None when the argument is required."""

    @property
    def input_name(self) -> str:
        """The form field's name."""
        return ARGUMENT_PREFIX + self.name


def parse_form(content_type: str | None, body: bytes) -> dict[str, str]:
    """An url-encoded form body as a dict (the first value of each name); FormError if not.

    An empty body is an empty form, whatever its content type.
    """
    if not body:
        return {}
    if (content_type or "").split(";")[0].strip().lower() != FORM_TYPE:
        raise FormError(400, f"a form must be sent as {FORM_TYPE}")
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=False,
            max_num_fields=MAX_FIELDS,
        )
    except (UnicodeDecodeError, ValueError) as error:
        raise FormError(400, f"malformed form: {error}") from None
    form: dict[str, str] = {}
    for name, value in pairs:
        form.setdefault(name, value)
    return form


def argument_fields(cls: type[FlowLogic[Any]]) -> tuple[ArgumentField, ...]:
    """The start form's fields of ``cls``; ArgumentError if the API cannot pass its arguments."""
    try:
        signature = inspect.signature(cls.__init__)
        hints = typing.get_type_hints(cls.__init__)
    except (TypeError, ValueError, NameError) as error:
        raise ArgumentError(f"cannot read its constructor's signature: {error}") from None
    fields = []
    for parameter in list(signature.parameters.values())[1:]:  # past self
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.POSITIONAL_ONLY):
            raise ArgumentError("its constructor takes positional-only or *args arguments")
        if parameter.kind == parameter.VAR_KEYWORD:
            continue
        annotation = hints.get(parameter.name, Any)
        fields.append(
            ArgumentField(
                parameter.name,
                _shown(annotation),
                _is_text(annotation),
                None if parameter.default is parameter.empty else repr(parameter.default),
            )
        )
    return tuple(fields)


def form_arguments(fields: tuple[ArgumentField, ...], form: dict[str, str]) -> dict[str, Any]:
    """The arguments a submitted start form gives (see the module docstring)."""
    arguments: dict[str, Any] = {}
    for field in fields:
        text = form.get(field.input_name, "")
        if text == "":
            continue
        if field.text:
            arguments[field.name] = text
            continue
        try:
            arguments[field.name] = json.loads(text)
        except json.JSONDecodeError as error:
            raise ArgumentError(
                f"argument {field.name!r}: not JSON ({error.msg}); write numbers, true or "
                "false, [lists] and {objects} as JSON, strings in double quotes"
            ) from None
    return arguments


def _is_text(annotation: Any) -> bool:
    if annotation in _TEXT_TYPES:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        others = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(others) == 1 and others[0] in _TEXT_TYPES
    return False


def _shown(annotation: Any) -> str:
    if annotation is Any:
        return "any JSON"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("flows.party.", "")
