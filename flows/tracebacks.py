"""Tracebacks of failed flows: formatted once, bounded, kept on the node, shown to its people.

When flow code raises, the fiber formats the exception's traceback with
:func:`flow_traceback` and the state machine stores it beside the error
(``node_flow_exceptions.traceback``). It never leaves the node: a counterparty learns only
what :class:`~flows.errors.FlowException` passes on.

The text starts at the flow's own ``call()`` (the fiber's frames above it are left out), and
its first line names the innermost frame of code outside fiberflow, where the bug most often
is. A traceback longer than :data:`MAX_TRACEBACK_CHARS` keeps its beginning (the user's frames
and the chain of causes) and its end (the innermost frames and the exception line), with a
note of what was cut between them.

Whoever raises the stored error again (:meth:`flows.node.node.Node.flow_result`,
:class:`flows.node.client.NodeClient`) chains a :class:`FlowTraceback` as its ``__cause__``, so
an uncaught ``handle.result()`` prints the flow's frames above the caller's.
"""

from __future__ import annotations

import traceback
import types
from pathlib import Path

MAX_TRACEBACK_CHARS = 16_000
"""A formatted traceback longer than this is cut in the middle (head and tail kept)."""

_HEAD_CHARS = 5_000
"""How much of a cut traceback's beginning is kept (the rest of the room goes to its end)."""

_FIBERFLOW_ROOT = Path(__file__).resolve().parent.parent
FIBERFLOW_PACKAGES = tuple(
    str(_FIBERFLOW_ROOT / package) + "/"
    for package in ("flows", "foundation", "statemachine", "messaging", "persistence")
)
"""The folders of fiberflow's own packages (a frame of a file in one is not flow code)."""
_FIBER_FILE = str(_FIBERFLOW_ROOT / "flows" / "node" / "fiber.py")


class FlowTraceback(Exception):
    """The traceback of a flow that failed on its node, as text (a raised error's cause)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text
        """The formatted traceback, as the node stored it."""

    def __str__(self) -> str:
        return f"\n\nthe flow's traceback on its node:\n{self.text.rstrip()}"


def is_fiberflow_file(filename: str) -> bool:
    """True if ``filename`` is one of fiberflow's own modules (not flow code, not a test)."""
    try:
        resolved = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return resolved.startswith(FIBERFLOW_PACKAGES)


def flow_traceback(exception: BaseException) -> str:
    """The bounded, formatted traceback of ``exception`` raised by flow code.

    Frames of the fiber that ran the flow are dropped, so the text starts at ``call()``;
    the first line names the innermost frame outside fiberflow (the flow's own code).
    """
    tb = _without_fiber_frames(exception.__traceback__)
    lines = traceback.format_exception(type(exception), exception, tb)
    text = "".join(lines)
    innermost = _innermost_user_frame(tb)
    if innermost is not None:
        text = f"raised in flow code at {innermost}\n{text}"
    return bound_traceback(text)


def bound_traceback(text: str) -> str:
    """``text`` if it fits :data:`MAX_TRACEBACK_CHARS`, else its head and tail with a note."""
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    note_room = 80
    tail_chars = MAX_TRACEBACK_CHARS - _HEAD_CHARS - note_room
    cut = len(text) - _HEAD_CHARS - tail_chars
    return (
        f"{text[:_HEAD_CHARS]}\n... ({cut} characters of traceback cut) ...\n{text[-tail_chars:]}"
    )


def _without_fiber_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` from the first frame below the fiber's own (the flow's ``call()``)."""
    first = tb
    while first is not None and first.tb_frame.f_code.co_filename == _FIBER_FILE:
        first = first.tb_next
    return first if first is not None else tb


def _innermost_user_frame(tb: types.TracebackType | None) -> str | None:
    """``file:line in function`` of the last frame in ``tb`` outside fiberflow, or None."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_fiberflow_file(code.co_filename):
            found = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return found
