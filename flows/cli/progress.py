"""A one-line progress bar for long work on the command line.

On a terminal it redraws one line; otherwise (CI logs, pipes) it prints a line at each
tenth of the way, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``bar.update(done)`` as work advances; ``bar.finish()`` at the end."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 30):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.started = time.perf_counter()
        self._interactive = self.stream.isatty()
        self._last_tenth = -1
        self._done = 0

    def update(self, done: int) -> None:
        """Show ``done`` of ``total`` finished."""
        self._done = done
        if self._interactive:
            self.stream.write("\r" + self._line())
            self.stream.flush()
            return
        tenth = done * 10 // self.total
        if tenth != self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(self._line() + "\n")
            self.stream.flush()

    def _line(self) -> str:
        fraction = min(self._done / self.total, 1.0)
        filled = round(fraction * self.width)
        elapsed = time.perf_counter() - self.started
        rate = self._done / elapsed if elapsed > 0 else 0.0
        bar = "#" * filled + "." * (self.width - filled)
        return (
            f"  {self.label} [{bar}] {self._done}/{self.total} "
            f"({fraction:4.0%}) {elapsed:6.1f} s {rate:8,.0f}/s"
        )

    def finish(self) -> None:
        """End the line (on a terminal)."""
        if self._interactive:
            self.stream.write("\n")
            self.stream.flush()
