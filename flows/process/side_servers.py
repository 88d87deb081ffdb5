"""The servers a node process runs beside its node: Prometheus metrics and the HTTP API.

With a ``[metrics]`` section the process serves its metrics (on a port of their own, and at
``/metrics`` of the API when it has one too); with an ``[rpc]`` section it serves the node's
HTTP API and console (:mod:`flows.rpc`) on a thread, from when it holds the node's lease until
it stops. A port in use or a bad certificate is a start-up failure, logged in one line.
``prometheus_client`` and the API's libraries are imported only when configured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flows.config.runtime import RuntimeConfig

if TYPE_CHECKING:
    from flows.metrics import MetricsServer, NodeMetrics

log = logging.getLogger("fiberflow.runtime")


class SideServers:
    """The metrics server and the API server of one node process."""

    def __init__(self, config: RuntimeConfig, worker_name: str | None) -> None:
        self.config = config
        self.worker_name = worker_name
        self.metrics: NodeMetrics | None = None
        """The node's Prometheus metrics, with the config's ``[metrics]`` (across rebuilds)."""
        self.metrics_server: MetricsServer | None = None
        """The HTTP server serving them, while the process runs."""
        self.rpc_server: Any = None
        """The API server (:class:`flows.rpc.server.RpcServer`) while it serves, else None."""
        self.metrics_app: Any = None
        """An ASGI app the API serves at ``/metrics``, or None."""

    def serve_metrics(self) -> bool:
        """Serve the metrics if the config asks for them; False (logged) if the port is in use."""
        settings = self.config.metrics
        if settings is None:
            return True
        from flows.metrics import MetricsServerError, NodeMetrics, serve_metrics

        self.metrics = NodeMetrics()
        try:
            self.metrics_server = serve_metrics(self.metrics, settings.address, settings.port)
        except MetricsServerError as error:
            log.error("%s: %s; refusing to start", self.config.name, error)
            return False
        log.info(
            "%s: metrics at http://%s:%d/metrics",
            self.config.name,
            settings.address,
            self.metrics_server.port,
        )
        return True

    def stop_metrics(self) -> None:
        """Stop serving the metrics (if they were served)."""
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    def start_rpc(
        self,
        mac_key: bytes,
        ready: Callable[[], bool],
        process_info: Callable[[], dict[str, Any]],
    ) -> bool:
        """Serve the API if the config asks for it; False (logged) if it cannot be served.

        ``mac_key`` is the node's checkpoint key (the API reads checkpoints), ``ready`` what
        ``GET /ready`` answers and ``process_info`` what ``GET /api/node`` says of the process.
        """
        rpc = self.config.rpc
        if rpc is None:
            return True
        port = rpc.port_for(self.worker_name)
        if port is None:
            log.info(
                "%s: worker %r serves no API (rpc.worker_ports does not name it)",
                self.config.name,
                self.worker_name,
            )
            return True
        from flows.rpc.service import RpcStartError, start_rpc_server

        if self.metrics_app is None and self.metrics is not None:  # [metrics] too: at /metrics
            from flows.metrics import metrics_asgi_app

            self.metrics_app = metrics_asgi_app(self.metrics)
        try:
            self.rpc_server = start_rpc_server(
                self.config,
                port,
                mac_key=mac_key,
                ready=ready,
                process_info=process_info,
                metrics_app=self.metrics_app,
            )
        except RpcStartError as error:
            log.error("%s: %s; refusing to start", self.config.name, error)
            return False
        return True

    def stop_rpc(self) -> None:
        """Stop serving the API (if it was served)."""
        if self.rpc_server is not None:
            self.rpc_server.stop()
            self.rpc_server = None
