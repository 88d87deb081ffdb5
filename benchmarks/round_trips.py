"""Counting PostgreSQL round trips from psycopg's waits, for the benchmarks and the tests.

psycopg (version 3) runs each operation as a generator that yields what it waits for; the
connection's ``wait`` drives it. :func:`counting_wait` wraps a ``wait`` so that each
operation that waits for the server's reply is reported once. A reply that had already
arrived when psycopg looked shows no wait, so the count is a lower bound of the round trips
made (the tests bound it from above). Nothing here is part of fiberflow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def waits_for_reply(state: Any) -> bool:
    """A psycopg generator's wait state is a wait for the server's reply (read only).

    Queuing in pipeline mode waits for read-or-write; waiting for results reads only.
    """
    wait = state[1] if isinstance(state, tuple) else state
    return int(wait) == 1  # psycopg.waiting.Wait.R


def counting_wait(original: Any, on_reply_wait: Callable[[Any], None]) -> Any:
    """``original`` (``psycopg.Connection.wait``) calling ``on_reply_wait(gen)`` once for
    each operation generator that waits for the server's reply."""

    def counted(gen: Any) -> Any:
        waited = False
        try:
            state = gen.send(None)
            while True:
                if not waited and waits_for_reply(state):
                    waited = True
                    on_reply_wait(gen)
                reply = yield state
                state = gen.send(reply)
        except StopIteration as stop:
            return stop.value

    def wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, counted(gen), *args, **kwargs)

    return wait
