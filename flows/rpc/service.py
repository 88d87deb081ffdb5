"""The API of one node process, assembled: database, gateway, users, app and server.

:func:`start_rpc_server` is what :class:`flows.process.process.NodeProcess` calls when its config
has an ``[rpc]`` section; the :class:`RpcService` it returns is stopped with the process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp

from flows.config.runtime import RuntimeConfig
from flows.cordapps import Cordapps
from flows.rpc.app import build_app
from flows.rpc.auth import Authenticator
from flows.rpc.gateway import NodeGateway
from flows.rpc.server import RpcServer, RpcStartError
from persistence.store import NodeDatabase

__all__ = ["RpcService", "RpcStartError", "start_rpc_server"]


class RpcService:
    """The API's server and the database connection it reads through."""

    def __init__(self, server: RpcServer, gateway: NodeGateway) -> None:
        self.server = server
        self.gateway = gateway

    @property
    def url(self) -> str:
        """The API's base URL, e.g. ``http://127.0.0.1:8080``."""
        return self.server.url

    def stop(self) -> None:
        """End open streams and waits, stop the server, close the database connections."""
        self.gateway.closing.set()
        try:
            self.server.stop()
        finally:
            self.gateway.database.close()


def start_rpc_server(
    config: RuntimeConfig,
    port: int,
    *,
    mac_key: bytes | None = None,
    ready: Callable[[], bool] = lambda: False,
    process_info: Callable[[], dict[str, Any]] = dict,
    metrics_app: ASGIApp | None = None,
) -> RpcService:
    """Serve the API of the node ``config`` describes on ``port``; RpcStartError if not."""
    assert config.rpc is not None
    database = NodeDatabase(
        config.database_url,
        schema_name=config.database_schema,
        mac_key=mac_key,
        application_name="fiberflow-rpc",
        create=False,
    )
    try:
        gateway = NodeGateway(
            database,
            config.name,
            Cordapps(config.cordapps),
            ready=ready,
            process_info=process_info,
        )
        app = build_app(
            gateway,
            Authenticator(config.rpc.users),
            config.rpc.max_body_bytes,
            metrics_app,
            secure_cookies=config.rpc.tls,
        )
        server = RpcServer(app, config.rpc, port, config.name)
        server.start()
    except BaseException:
        database.close()
        raise
    return RpcService(server, gateway)
