"""QuoteFlow asks an HTTP quote service for a price, without blocking its node.

The HTTP call is an external operation (``FlowLogic.call_external``): the node runs it on its
thread pool while its other flows go on, retries it when the service cannot be reached, and
journals the answer. The request carries the operation's idempotency key in an
``Idempotency-Key`` header, so the service answers a repeated call (after a crash of the node
between the answer and its checkpoint) with the answer it gave, and does its work once.
Run the service with ``python -m samples.quotes.service``.
"""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from flows import FlowLogic, OperationContext, RetryPolicy, startable_by_rpc

QUOTE_RETRIES = RetryPolicy(
    attempts=5,
    backoff=0.2,
    max_backoff=5.0,
    retry_on=(urllib.error.URLError, ConnectionError, TimeoutError),
)
"""Retry what a restarting or unreachable service causes; an HTTP error answer is final."""


def fetch_quote(service_url: str, symbol: str, context: OperationContext) -> dict[str, Any]:
    """GET ``/quote?symbol=...`` from the service, with the operation's idempotency key."""
    query = urllib.parse.urlencode({"symbol": symbol})
    request = urllib.request.Request(
        f"{service_url.rstrip('/')}/quote?{query}",
        headers={"Idempotency-Key": context.idempotency_key},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


@startable_by_rpc
class QuoteFlow(FlowLogic[dict[str, Any]]):
    """Get a quote for ``symbol`` from the service at ``service_url``."""

    def __init__(self, symbol: str, service_url: str) -> None:
        self.symbol = symbol
        self.service_url = service_url

    def call(self) -> dict[str, Any]:
        """Ask the service (at least once, exactly once with its idempotency key)."""
        self.progress("Asking the quote service")
        quote: dict[str, Any] = self.call_external(
            functools.partial(fetch_quote, self.service_url, self.symbol),
            label="fetch quote",
            timeout=30,
            retry=QUOTE_RETRIES,
        )
        return quote
