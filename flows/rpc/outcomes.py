"""A flow's result or error as JSON: what the API answers for a finished flow."""

from __future__ import annotations

import base64
import datetime
import math
from typing import Any

import attrs

from flows.party import Party
from foundation.serialization import PAYLOADS, SerializationError
from persistence.node_store import StoredOutcome


def json_value(value: Any) -> Any:
    """A JSON-able form of a flow's result.

    JSON's own types stay as they are (a NaN or infinite float becomes its text); a
    ``Party`` is its X.500 name; tuples, lists and sets become lists; dicts get string keys;
    attrs values become objects of their fields (with ``"type"``, the class name); bytes
    become ``{"bytes_base64": ...}``; times are ISO 8601 text; anything else its ``repr``.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN nor infinity
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Party):
        return value.name
    if isinstance(value, list | tuple | set | frozenset):
        return [json_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_value(item) for key, item in value.items()}
    if isinstance(value, bytes):
        return {"bytes_base64": base64.b64encode(value).decode()}
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if attrs.has(type(value)):
        fields = {f.name: json_value(getattr(value, f.name)) for f in attrs.fields(type(value))}
        return {"type": type(value).__name__, **fields}
    return repr(value)


def outcome_document(outcome: StoredOutcome) -> dict[str, Any]:
    """``{"result": ...}`` or ``{"error": {"kind", "class", "message", "traceback"}}``.

    ``kind`` is who is to blame (:class:`~statemachine.flow_error.ErrorKind`'s value:
    ``flow_exception``, ``unexpected_end``, ``non_determinism`` or ``internal``), which a
    client needs to raise the error as the flow's own node would.
    """
    if outcome.error is not None:
        return {
            "error": {
                "kind": outcome.error.kind.value,
                "class": outcome.error.exception_class,
                "message": outcome.error.message,
                "traceback": outcome.traceback or None,
            }
        }
    assert outcome.result is not None
    try:
        return {"result": json_value(PAYLOADS.decode(outcome.result))}
    except SerializationError as error:
        return {"result": None, "undecodable": str(error)}


def iso_time(milliseconds: int | None) -> str | None:
    """A database time (ms since the epoch) as ISO 8601 UTC text."""
    if milliseconds is None:
        return None
    moment = datetime.datetime.fromtimestamp(milliseconds / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds")
