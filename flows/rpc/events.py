"""The progress stream of one flow: server-sent events as its progress and outcome change.

The stream polls the node database every :data:`POLL_SECONDS` (a cheap read by primary key)
and sends an event whenever what it reads changes:

* ``event: status`` with ``{"flow_id", "status", "progress_step"}``: first at once, then at
  each change of status or progress step;
* ``event: outcome`` with ``{"flow_id", "status", "outcome"}`` once the flow has ended, and
  the stream ends;
* ``event: gone`` with ``{"flow_id", "error"}`` if the flow's checkpoint went without an
  outcome kept (the stream ends).

Steps are read from the flow's checkpoint row, so a step the flow passes between two commits
(or within one poll interval) is not seen; every committed step a flow stays in for longer
than the interval is. A comment line (``: keep-alive``) goes out every
:data:`KEEPALIVE_SECONDS` so that proxies keep an idle stream open.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.concurrency import run_in_threadpool

from flows.rpc.gateway import ApiError, NodeGateway

POLL_SECONDS = 0.1
"""How often a stream reads the flow's row."""
KEEPALIVE_SECONDS = 15.0


def sse(event: str, data: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def progress_events(gateway: NodeGateway, flow_id: str) -> AsyncIterator[str]:
    """The events of ``flow_id`` (see the module docstring); the caller checked it exists."""
    last: tuple[str | None, str | None] | None = None
    quiet_since = time.monotonic()
    while not gateway.closing.is_set():
        try:
            status, step, outcome = await run_in_threadpool(gateway.progress, flow_id)
        except ApiError as gone:  # its checkpoint went and the node kept no outcome
            yield sse("gone", {"flow_id": flow_id, "error": gone.message})
            return
        if outcome is not None:
            if last is None or last[0] != status:
                yield sse("status", {"flow_id": flow_id, "status": status, "progress_step": step})
            yield sse("outcome", {"flow_id": flow_id, "status": status, "outcome": outcome})
            return
        if (status, step) != last:
            last = (status, step)
            quiet_since = time.monotonic()
            yield sse("status", {"flow_id": flow_id, "status": status, "progress_step": step})
        elif time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(POLL_SECONDS)
