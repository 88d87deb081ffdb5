"""Prometheus metrics of a node (the ``metrics`` extra: ``pip install 'fiberflow[metrics]'``).

:class:`NodeMetrics` owns a registry with every metric a node exposes (docs/operations.md
lists them); build a node with ``instruments=metrics.instruments()`` to feed it.
:func:`metrics_asgi_app` serves the registry as an ASGI app (the RPC server mounts it at
``/metrics``), :func:`serve_metrics` on ``prometheus_client``'s own HTTP server (a node
config's ``[metrics]`` section). Importing this package imports ``prometheus_client``; the
node imports it only when metrics are configured.

It imports the node it observes (through :mod:`flows.node.instruments`); the node process
and the test harness import it.
"""

from __future__ import annotations

from flows.metrics.node_metrics import NodeMetrics
from flows.metrics.serving import MetricsServer, MetricsServerError, metrics_asgi_app, serve_metrics

__all__ = [
    "MetricsServer",
    "MetricsServerError",
    "NodeMetrics",
    "metrics_asgi_app",
    "serve_metrics",
]
