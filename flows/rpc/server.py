"""uvicorn serving the API on a thread of the node process.

:meth:`RpcServer.start` binds the socket and loads the TLS certificate before it returns, so
an address in use or a bad certificate is a start-up failure (:class:`RpcStartError`, one
line) and not a thread dying later. The thread runs uvicorn's event loop (uvicorn installs
no signal handlers off the main thread: the node process keeps its own); :meth:`stop` asks
it to finish (open progress streams end), waits for it, and closes the socket.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from flows.config.rpc import RpcConfig

log = logging.getLogger("fiberflow.rpc")

STOP_SECONDS = 5
"""How long :meth:`RpcServer.stop` waits for requests in progress."""


class RpcStartError(Exception):
    """The API cannot be served (address in use, unreadable certificate); one line."""


class RpcServer:
    """The API's HTTP(S) server on a thread of its own."""

    def __init__(self, app: ASGIApp, config: RpcConfig, port: int, node_name: str) -> None:
        """Serve ``app`` on ``config.address`` at ``port`` (0: a free port)."""
        self._app = app
        self._config = config
        self._port = port
        self._node_name = node_name
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None
        """Where it listens, once started (the port chosen if the config said 0)."""

    @property
    def url(self) -> str:
        """The API's base URL (once started)."""
        assert self.address is not None
        scheme = "https" if self._config.tls else "http"
        host = self.address[0]
        return f"{scheme}://{'[' + host + ']' if ':' in host else host}:{self.address[1]}"

    def start(self) -> None:
        """Load TLS, bind, and serve on a new thread; RpcStartError if it cannot."""
        config = self._config
        settings: dict[str, Any] = {}
        if config.tls:
            assert config.tls_certificate is not None and config.tls_key is not None
            try:
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                context.load_cert_chain(config.tls_certificate, config.tls_key)
            except (OSError, ssl.SSLError) as error:
                raise RpcStartError(
                    f"rpc: cannot load tls_certificate {config.tls_certificate} with tls_key "
                    f"{config.tls_key}: {error}"
                ) from None
            settings = {
                "ssl_certfile": str(config.tls_certificate),
                "ssl_keyfile": str(config.tls_key),
            }
        family = socket.AF_INET6 if ":" in config.address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((config.address, self._port))
            sock.listen(128)
        except OSError as error:
            sock.close()
            raise RpcStartError(
                f"rpc: cannot listen on {config.address} port {self._port}: "
                f"{error.strerror or error}"
            ) from None
        sock.set_inheritable(True)
        self._socket = sock
        self.address = sock.getsockname()[:2]
        server_config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_config=None,  # the node's logging stays as it is; uvicorn's loggers propagate
            log_level="warning",
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=STOP_SECONDS,
            **settings,
        )
        self._server = uvicorn.Server(server_config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="rpc-server", daemon=True
        )
        self._thread.start()
        log.info("%s: serving the API at %s", self._node_name, self.url)

    def stop(self) -> None:
        """Stop serving (requests in progress get :data:`STOP_SECONDS`) and close the socket."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_SECONDS * 2)
            if self._thread.is_alive():
                log.warning("%s: the API server did not stop in time", self._node_name)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None
