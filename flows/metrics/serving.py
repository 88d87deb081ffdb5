"""Serving a node's metrics: as an ASGI app to mount, or on an HTTP server of their own.

:func:`metrics_asgi_app` is what the node's RPC server mounts at ``/metrics``;
:func:`serve_metrics` is the ``[metrics]`` section of a node's config: ``prometheus_client``'s
own HTTP server on a thread, for a node without the RPC server.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
from prometheus_client import make_asgi_app, start_http_server

from flows.metrics.node_metrics import NodeMetrics


def metrics_asgi_app(metrics: NodeMetrics) -> Any:
    """An ASGI app answering every GET with ``metrics``' registry in the text format."""
    return make_asgi_app(registry=metrics.registry)


class MetricsServerError(RuntimeError):
    """The metrics server could not listen (the address is in use or cannot be bound)."""


@attrs.define
class MetricsServer:
    """The HTTP server serving a node's metrics, and its thread."""

    server: Any
    thread: threading.Thread

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS picked if the config said 0)."""
        return int(self.server.server_port)

    def close(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def serve_metrics(metrics: NodeMetrics, address: str, port: int) -> MetricsServer:
    """Serve ``metrics`` at ``http://address:port/metrics`` on a thread.

    Raises :class:`MetricsServerError` with one line if the port cannot be bound.
    """
    try:
        server, thread = start_http_server(port, addr=address, registry=metrics.registry)
    except OSError as error:
        raise MetricsServerError(
            f"cannot serve metrics on {address}:{port}: {error.strerror or error}"
        ) from None
    return MetricsServer(server, thread)
