"""The quotes sample: a flow that calls an HTTP service through an external operation."""

from samples.quotes.flows import QuoteFlow, fetch_quote

__all__ = ["QuoteFlow", "fetch_quote"]
