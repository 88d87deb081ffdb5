"""The errors of :class:`~flows.rpc.client.RpcClient`: the API's refusals as exceptions.

Each refusal of the node's HTTP API is ``{"error": "<one line>"}`` with a status
(docs/rpc.md, "Errors"); the client raises the subclass of :class:`RpcError` for that
status, carrying the status and the server's one-line reason. Nothing here needs httpx.
"""

from __future__ import annotations

from flows.errors import FiberflowError


class RpcError(FiberflowError):
    """The node's API refused a request, or could not be reached.

    ``status`` is the HTTP status (None when no answer came); ``reason`` the server's
    one-line reason (or what went wrong on the way); ``str(error)`` is the reason.
    """

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class RpcConnectionError(RpcError):
    """No answer: the address refused the connection, TLS failed, or the request timed out."""


class RpcAuthenticationError(RpcError):
    """401: no credentials, malformed ones, or a wrong password or token."""


class RpcPermissionError(RpcError):
    """403: the user lacks the permission, or the class may not be started over the API."""


class RpcBadRequestError(RpcError):
    """400, 405 or 413: the request itself is wrong (arguments, filters, body size)."""


class RpcNotFoundError(RpcError):
    """404: no such flow (or route) on the node."""


class RpcConflictError(RpcError):
    """409: a ``client_request_id`` used for another start, or the node refused an operation."""


class RpcUnavailableError(RpcError):
    """503: the node is draining (for starts) or is not ready."""


class RpcTimeoutError(RpcUnavailableError):
    """504: the node did not carry out an operation in time (it stays queued)."""


class RpcServerError(RpcError):
    """500 or another unexpected status: the node's log has the traceback."""


_BY_STATUS: dict[int, type[RpcError]] = {
    400: RpcBadRequestError,
    401: RpcAuthenticationError,
    403: RpcPermissionError,
    404: RpcNotFoundError,
    405: RpcBadRequestError,
    409: RpcConflictError,
    413: RpcBadRequestError,
    503: RpcUnavailableError,
    504: RpcTimeoutError,
}


def error_for_status(status: int, reason: str) -> RpcError:
    """The :class:`RpcError` for an answer with ``status`` and the server's ``reason``."""
    return _BY_STATUS.get(status, RpcServerError)(reason, status)
