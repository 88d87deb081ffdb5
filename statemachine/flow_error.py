"""Errors inside flows, as data: what a journal, a checkpoint or a session message carries.

Exceptions cannot be serialized safely, and the counterparty must not learn internal detail,
so the state machine only ever handles :class:`FlowError` values. The ``flows`` package turns
them back into exceptions when it resumes a flow with one.
"""

from __future__ import annotations

import enum
from typing import Annotated

import attrs

from statemachine.limits import ERROR_ID_CHARS, ERROR_MESSAGE_CHARS, EXCEPTION_CLASS_CHARS
from statemachine.wire_fields import Text, WirePart


class ErrorKind(enum.Enum):
    """Who is to blame for an error, which decides what the flow sees."""

    FLOW_EXCEPTION = "flow_exception"
    """A ``FlowException`` raised by flow code: its class and message are passed on."""
    UNEXPECTED_END = "unexpected_end"
    """The counterparty ended (finished, failed with an internal error, or was rejected)."""
    NON_DETERMINISM = "non_determinism"
    """Replay found the flow asking for something other than its journal says."""
    INTERNAL = "internal"
    """Any other exception in flow code: kept locally, never sent to a counterparty."""


MAX_ERROR_MESSAGE_CHARS = ERROR_MESSAGE_CHARS
"""Longer error messages are cut to this (so an error always fits in a session message)."""


def _bounded_message(message: str) -> str:
    """``message``, or its start and how much was cut: never over MAX_ERROR_MESSAGE_CHARS.

    Cutting a cut message changes nothing.
    """
    if not isinstance(message, str) or len(message) <= MAX_ERROR_MESSAGE_CHARS:
        return message  # (a wrong type is left for FlowError.validate to refuse)
    kept = MAX_ERROR_MESSAGE_CHARS - 64  # room for the note below
    return f"{message[:kept]}... ({len(message) - kept} more characters cut)"


@attrs.frozen
class FlowError(WirePart):
    """An error as the state machine stores and transmits it.

    Messages longer than ``MAX_ERROR_MESSAGE_CHARS`` are cut, so an error always fits in a
    session message (from the wire too: a longer one never reaches the text check).
    """

    kind: ErrorKind
    exception_class: Annotated[str, Text(EXCEPTION_CLASS_CHARS, may_be_empty=True)]
    message: Annotated[str, Text(ERROR_MESSAGE_CHARS, may_be_empty=True)] = attrs.field(
        converter=_bounded_message
    )
    error_id: Annotated[str, Text(ERROR_ID_CHARS, may_be_empty=True)] = ""
