"""Rendering the console's pages: Jinja2 templates with autoescaping, and strict headers.

Flow ids, class names, arguments, errors and tracebacks are untrusted text: the templates'
autoescaping escapes every value that is not explicitly marked safe (none is). Each answer
forbids everything not served by the page itself (Content-Security-Policy with a random
nonce for its inline style and script), framing, caching and sniffing.
"""

from __future__ import annotations

import secrets
from typing import Any

import jinja2
from starlette.responses import HTMLResponse

_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("flows.rpc.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(template: str, status: int = 200, **values: Any) -> HTMLResponse:
    """The page ``template`` filled with ``values``, with the console's security headers."""
    nonce = secrets.token_urlsafe(16)
    html = _ENVIRONMENT.get_template(template).render(nonce=nonce, **values)
    return HTMLResponse(html, status_code=status, headers=security_headers(nonce))


def security_headers(nonce: str) -> dict[str, str]:
    """The headers of every console page (``nonce`` admits its inline style and script)."""
    policy = (
        f"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; "
        "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
    return {
        "Content-Security-Policy": policy,
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
