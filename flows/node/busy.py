"""Flows that run too long without suspending: who is running, for how long, on which line.

A node runs its flows one at a time on its scheduler thread (greenlets are cooperative): a
flow that computes or blocks without suspending holds back every other flow of its node.
:class:`BusyMonitor` records which flow's code is running now (its fiber, or one of its
``in_transaction`` effects); :func:`where` finds the line it is on from another thread; the
node process's watchdog (:class:`BusyWatchdog`) logs a flow that has run longer than a
configured time, shows it in ``fiberflow flow list``, and makes SIGTERM take effect within
seconds whatever the flow does (:class:`NodeStopping`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from threading import get_ident
from types import FrameType

import attrs

from flows.tracebacks import FIBERFLOW_PACKAGES

log = logging.getLogger("fiberflow.busy")

STOP_GRACE_SECONDS = 2.0
"""After SIGTERM, flow code still running this long is interrupted (see NodeStopping)."""
REPEAT_SECONDS = 30.0
"""A flow still running is logged again this often."""


class NodeStopping(BaseException):
    """Raised in flow code that still runs after the node was asked to stop.

    A ``BaseException``, so flow code's ``except Exception`` does not swallow it and the
    flow is not failed by it: the node stops without committing anything more, and the flow
    resumes from its last checkpoint at the next start.
    """


@attrs.frozen
class Running:
    """A flow whose code is running now."""

    flow_id: str
    flow_class: str
    since: float
    """``time.monotonic()`` when it was switched in."""
    thread_id: int
    run: int
    """A number for this stretch of running (a flow switched in again gets a new one)."""

    def seconds(self) -> float:
        """How long it has been running."""
        return time.monotonic() - self.since


_Mark = tuple[str, str, float, int, int]
"""What :class:`BusyMonitor` keeps of the running flow: a :class:`Running`'s fields."""


class BusyMonitor:
    """Which flow's code the scheduler thread runs now (set by the fibers and effects).

    It is told at every switch into flow code, so it keeps a plain tuple (replaced whole, so
    another thread always reads a consistent one) and makes the :class:`Running` only when
    asked.
    """

    def __init__(self) -> None:
        self._current: _Mark | None = None
        self._runs = 0

    def enter(self, flow_id: str, flow_class: str) -> _Mark | None:
        """Mark ``flow_id``'s code as running; returns what to hand :meth:`leave` after it."""
        outer = self._current
        self._runs += 1
        self._current = (flow_id, flow_class, time.monotonic(), get_ident(), self._runs)
        return outer

    def leave(self, outer: _Mark | None) -> None:
        """The code marked by the :meth:`enter` that returned ``outer`` is no longer running."""
        self._current = outer

    @contextlib.contextmanager
    def running(self, flow_id: str, flow_class: str) -> Iterator[None]:
        """Mark ``flow_id``'s code as running for the duration of the block."""
        outer = self.enter(flow_id, flow_class)
        try:
            yield
        finally:
            self.leave(outer)

    def current(self) -> Running | None:
        """The flow running now, if any (safe to read from any thread)."""
        mark = self._current
        return None if mark is None else Running(*mark)


def where(running: Running) -> str:
    """``file.py:42 in call`` of the flow's own code, from another thread (best effort).

    The innermost frame outside fiberflow's packages is the line the flow is on (if the
    flow is inside a library call, that call's line in the flow's code is named too).
    """
    frame: FrameType | None = sys._current_frames().get(running.thread_id)
    innermost: FrameType | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(FIBERFLOW_PACKAGES):
            if innermost is None:
                innermost = frame
            module = frame.f_globals.get("__name__", "")
            if running.flow_class.startswith(module + "."):
                line = _describe(frame)
                return line if frame is innermost else f"{line} (in {_describe(innermost)})"
        frame = frame.f_back
    return _describe(innermost) if innermost is not None else "an unknown line"


def _describe(frame: FrameType) -> str:
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"


class BusyWatchdog:
    """Watches a node's flows for long runs without suspending (a thread of its own).

    ``note(flow_id, since, location)`` and ``clear(flow_id)`` record and forget a busy flow
    where ``fiberflow flow list`` shows it (the node database). After :meth:`stop_requested`,
    flow code still running after ``STOP_GRACE_SECONDS`` is interrupted: the watchdog sends
    SIGTERM to the scheduler thread, whose handler (:meth:`interrupt_if_due`) raises
    :class:`NodeStopping` in the flow.
    """

    def __init__(
        self,
        monitor: BusyMonitor,
        warn_after: float,
        note: Callable[[str, float, str], None],
        clear: Callable[[str], None],
        name: str,
    ) -> None:
        self._monitor = monitor
        self._warn_after = warn_after
        self._note = note
        self._clear = clear
        self._name = name
        self._stop = threading.Event()
        self._stop_requested_at: float | None = None
        self._reported: Running | None = None
        self._next_report = 0.0
        self._thread = threading.Thread(target=self._watch, name=f"busy-{name}", daemon=True)
        # Notes are written on a thread of their own: writing one may wait for the database
        # (the busy flow itself may hold SQLite's write lock), the watchdog never does.
        self._writer = concurrent.futures.ThreadPoolExecutor(1, f"busy-notes-{name}")

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def close(self) -> None:
        """Stop watching (a flow still reported is cleared)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._writer.shutdown(wait=True, cancel_futures=False)

    def stop_requested(self) -> None:
        """The node was asked to stop: flow code may run ``STOP_GRACE_SECONDS`` more."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()

    def interrupt_if_due(self) -> None:
        """In the scheduler thread's signal handler: raise NodeStopping in overdue flow code."""
        running = self._monitor.current()
        if (
            self._stop_requested_at is not None
            and running is not None
            and running.thread_id == threading.get_ident()
            and time.monotonic() - max(self._stop_requested_at, running.since) >= STOP_GRACE_SECONDS
        ):
            raise NodeStopping(
                f"flow {running.flow_id} ({running.flow_class}) still running "
                f"{running.seconds():.1f} s after the node was asked to stop"
            )

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            try:
                self._check()
            except Exception:  # the watchdog must not die: it is how a stuck node is seen
                log.exception("%s: the busy-flow watchdog failed", self._name)
        if self._reported is not None:
            self._write(self._clear, self._reported.flow_id)

    def _write(self, note: Callable[..., None], *args: object) -> None:
        def write() -> None:
            try:
                note(*args)
            except Exception as error:  # a locked or unreachable database: a note is lost
                log.warning("%s: cannot note a busy flow in the database: %s", self._name, error)

        self._writer.submit(write)

    def _check(self) -> None:
        running = self._monitor.current()
        now = time.monotonic()
        requested = self._stop_requested_at
        if (
            running is not None
            and requested is not None
            and now - max(requested, running.since) >= STOP_GRACE_SECONDS
            and threading.main_thread().ident == running.thread_id
        ):
            signal.pthread_kill(running.thread_id, signal.SIGTERM)
        reported = self._reported
        if reported is not None and (running is None or running.run != reported.run):
            log.warning(
                "%s: flow %s (%s) ran %.1f s without suspending",
                self._name,
                reported.flow_id,
                reported.flow_class,
                time.monotonic() - reported.since,
            )
            self._write(self._clear, reported.flow_id)
            self._reported = None
        if running is None:
            return
        seconds = now - running.since
        if seconds >= self._warn_after and (self._reported is None or now >= self._next_report):
            location = where(running)
            log.warning(
                "%s: flow %s (%s) has been running %.1f s without suspending, at %s; every "
                "other flow of this node waits for it (flow code must not block or compute "
                "for long: see docs/writing-flows.md)",
                self._name,
                running.flow_id,
                running.flow_class,
                seconds,
                location,
            )
            self._write(self._note, running.flow_id, time.time() - seconds, location)
            self._reported = running
            self._next_report = now + REPEAT_SECONDS
