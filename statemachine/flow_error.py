"""Errors inside flows, as data: what a journal, a checkpoint or a session message carries.

Exceptions cannot be serialized safely, and the counterparty must not learn internal detail,
so the state machine only ever handles :class:`FlowError` values. The ``flows`` package turns
them back into exceptions when it resumes a flow with one.
"""

from __future__ import annotations

import enum

import attrs

from statemachine.limits import ERROR_MESSAGE_CHARS


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
        return message  # (a wrong type is left for the decoder's type checks to refuse)
    kept = MAX_ERROR_MESSAGE_CHARS - 64  # room for the note below
    return f"{message[:kept]}... ({len(message) - kept} more characters cut)"


@attrs.frozen
class FlowError:
    """An error as the state machine stores and transmits it.

    Messages longer than ``MAX_ERROR_MESSAGE_CHARS`` are cut, so an error always fits in a
    session message.
    """

    kind: ErrorKind
    exception_class: str
    message: str = attrs.field(converter=_bounded_message)
    error_id: str = ""
