"""External operations: what flows call outside the node, run off the scheduler.

A flow's code runs in a greenlet on the node's one scheduler thread, so a flow that waited
on a socket or computed for a while would stop every other flow of the node.
``FlowLogic.call_external(operation)`` hands the callable to the node instead and suspends;
:class:`ExternalOperations` runs it on a bounded thread pool (a coroutine function on an
event loop the node owns, in a thread of its own) and hands the end back to the scheduler,
which journals it (:mod:`statemachine.transitions.external_operations` has the rules).

Each attempt gets an :class:`OperationContext` whose ``idempotency_key`` is the same on every
attempt and every re-run of that step of the flow: an operation runs at least once per step
(again after a crash between its end and the flow's next commit), and the service it calls
can use the key to make that exactly once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from foundation.serialization import Serializer
from statemachine.actions import StartOperation
from statemachine.flow_error import ErrorKind, FlowError
from statemachine.iorequests import RetryPolicy
from statemachine.ports import EndedAttempt
from statemachine.state import Raised, Value
from statemachine.transitions.external_operations import OPERATION_FAILED_EXCEPTION

log = logging.getLogger("fiberflow.operations")

DEFAULT_OPERATION_THREADS = 16
"""Threads a node runs external operations on unless its config says otherwise."""


@attrs.frozen
class OperationContext:
    """What an external operation is called with."""

    idempotency_key: str
    """The same on every attempt and re-run of this step of the flow: give it to the service
    called (an ``Idempotency-Key`` header, a unique column) so it acts once."""
    flow_id: str
    label: str
    attempt: int
    """1 for the first attempt, 2 for the first retry, and so on."""


def is_coroutine_operation(operation: Callable[..., Any]) -> bool:
    """True if calling ``operation`` makes a coroutine (it then runs on the node's loop)."""
    target: Any = operation
    while isinstance(target, functools.partial):
        target = target.func
    call = getattr(target, "__call__", None)  # noqa: B004 - a callable object's method
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(call)


@attrs.frozen
class _Registered:
    operation: Callable[[OperationContext], Any]
    label: str
    policy: RetryPolicy


class ExternalOperations:
    """Runs flows' external operations (implements ``statemachine.ports.OperationRunner``).

    ``threads`` bounds the plain functions running at once (more wait their turn); coroutine
    functions all run on one event loop. ``wake`` is called from the thread where an attempt
    ended (a node process's loop sleeps until it is). Results are encoded with ``payloads``
    (the allow-list applies) and may be at most ``max_result_bytes`` long.
    """

    def __init__(
        self,
        payloads: Serializer,
        *,
        threads: int = DEFAULT_OPERATION_THREADS,
        max_result_bytes: int | None = None,
        wake: Callable[[], None] | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError(f"external operations need at least one thread, not {threads}")
        self._payloads = payloads
        self.threads = threads
        self._max_result_bytes = max_result_bytes
        self.wake = wake
        """Called (from any thread) whenever an attempt ends."""
        self._registered: dict[str, dict[int, _Registered]] = {}
        """By flow, by ordinal: a flow's end drops its own entries, whatever else is held."""
        self._running: dict[str, dict[int, tuple[int, concurrent.futures.Future[Any]]]] = {}
        """By flow, by ordinal: the attempt running and its future."""
        self._in_flight = 0
        self._ended: list[EndedAttempt] = []
        self._changed = threading.Condition()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._closed = False

    # --- what the flow's fiber calls --------------------------------------------------------

    def register(
        self,
        flow_id: str,
        ordinal: int,
        operation: Callable[[OperationContext], Any],
        label: str,
        policy: RetryPolicy,
    ) -> None:
        """Keep the flow's ``ordinal``-th operation until the flow is gone from the node."""
        self._registered.setdefault(flow_id, {})[ordinal] = _Registered(operation, label, policy)

    # --- OperationRunner --------------------------------------------------------------------

    def start(self, actions: Sequence[StartOperation]) -> None:
        """Start each attempt; an earlier attempt of the same operation is abandoned."""
        for action in actions:
            self._start(action)

    def abandon(self, flow_id: str) -> None:
        """Cancel the flow's running attempts and forget its operations.

        A thread already running an attempt finishes it, but its end is dropped.
        """
        self._registered.pop(flow_id, None)
        if flow_id not in self._running:
            return
        with self._changed:
            running = self._running.pop(flow_id, {})
            self._in_flight -= len(running)
        for _, future in running.values():
            future.cancel()

    def take_ended(self) -> list[EndedAttempt]:
        """The attempts that ended since the last call."""
        with self._changed:
            ended, self._ended = self._ended, []
        return ended

    # --- for the node and tests -------------------------------------------------------------

    def in_flight(self) -> int:
        """Attempts started and not yet ended (nor abandoned)."""
        with self._changed:
            return self._in_flight

    def busy(self) -> bool:
        """True while an attempt runs or an ended one waits to be taken."""
        with self._changed:
            return bool(self._in_flight or self._ended)

    def wait_for_end(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until an ended attempt is waiting to be taken."""
        with self._changed:
            return self._changed.wait_for(lambda: bool(self._ended), timeout)

    def close(self) -> None:
        """Stop: attempts not yet begun are cancelled, running threads are not waited for."""
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        loop, thread = self._loop, self._loop_thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                for task in asyncio.all_tasks(loop):
                    task.cancel()  # coroutines still waiting: they end with the loop
                loop.run_until_complete(asyncio.sleep(0))
                loop.close()

    # --- running ----------------------------------------------------------------------------

    def _start(self, action: StartOperation) -> None:
        registered = self._registered.get(action.flow_id, {}).get(action.ordinal)
        if registered is None:
            message = (
                f"external operation #{action.ordinal} of flow {action.flow_id} is not known to "
                "this node (was the flow's code changed?)"
            )
            self._end(action, Raised(_failure(message)), retryable=False)
            return
        if self._closed:
            return  # the node is stopping: the flow's replay runs the attempt again
        context = OperationContext(action.key, action.flow_id, registered.label, action.attempt)
        future: concurrent.futures.Future[Any]
        if is_coroutine_operation(registered.operation):
            future = asyncio.run_coroutine_threadsafe(
                registered.operation(context), self._event_loop()
            )
        else:
            future = self._thread_pool().submit(registered.operation, context)
        with self._changed:
            attempts = self._running.setdefault(action.flow_id, {})
            previous = attempts.get(action.ordinal)
            attempts[action.ordinal] = (action.attempt, future)
            self._in_flight += previous is None
        if previous is not None:
            previous[1].cancel()
        future.add_done_callback(lambda done: self._done(action, registered, done))

    def _done(
        self,
        action: StartOperation,
        registered: _Registered,
        future: concurrent.futures.Future[Any],
    ) -> None:
        with self._changed:
            attempts = self._running.get(action.flow_id, {})
            current = attempts.get(action.ordinal)
            if current is None or current[1] is not future:
                return  # abandoned, or a later attempt replaced it
            del attempts[action.ordinal]
            if not attempts:
                del self._running[action.flow_id]
            self._in_flight -= 1
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            self._end(action, self._result(registered, future.result()), retryable=False)
            return
        name = f"{type(error).__module__}.{type(error).__qualname__}"
        message = f"{registered.label} raised {name}: {error}"
        retryable = registered.policy.retries(type(error))
        self._end(action, Raised(_failure(message)), retryable=retryable)

    def _result(self, registered: _Registered, result: Any) -> Value | Raised:
        try:
            data = self._payloads.encode(result)
        except Exception as error:
            return Raised(
                _failure(f"{registered.label} returned a value that is not a payload: {error}")
            )
        limit = self._max_result_bytes
        if limit is not None and len(data) > limit:
            return Raised(
                _failure(
                    f"{registered.label} returned {len(data)} bytes, more than the "
                    f"{limit} a result may have"
                )
            )
        return Value(data)

    def _end(self, action: StartOperation, outcome: Value | Raised, retryable: bool) -> None:
        ended = EndedAttempt(action.flow_id, action.ordinal, action.attempt, outcome, retryable)
        with self._changed:
            self._ended.append(ended)
            self._changed.notify_all()
        if self.wake is not None:
            self.wake()

    def _thread_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.threads, thread_name_prefix="fiberflow-operation"
            )
        return self._pool

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="fiberflow-operation-loop", daemon=True
            )
            thread.start()
            self._loop, self._loop_thread = loop, thread
        return self._loop


def _failure(message: str) -> FlowError:
    return FlowError(ErrorKind.FLOW_EXCEPTION, OPERATION_FAILED_EXCEPTION, message)
