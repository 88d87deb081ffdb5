"""The ``[rpc]`` section of a node config: where the API listens, TLS, and its users.

::

    [rpc]
    address = "127.0.0.1"              # default; a non-loopback address needs TLS or
    port = 8080                        # allow_plain_non_loopback = true (0: any free port)
    tls_certificate = "rpc.cert.pem"   # both or neither: HTTPS when given
    tls_key = "rpc.key.pem"
    allow_plain_non_loopback = false
    max_body_bytes = 65536             # larger request bodies are refused (413)
    worker_ports = { w1 = 8081 }       # a node run by several workers: who serves, where

    [[rpc.users]]
    name = "alice"
    password_hash = "$argon2id$..."    # or token_hash (exactly one of the two)
    start = ["samples.pingpong.flows.PingFlow"]   # or ["*"]: every @startable_by_rpc flow
    observe = true
    operate = false

Checked at config load (:func:`parse_rpc_section`); a problem is a ``ConfigError`` naming
the field. Nothing here imports the RPC stack (Starlette, uvicorn, argon2).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

DEFAULT_ADDRESS = "127.0.0.1"
"""Where the API listens unless the config says otherwise: this machine only."""
DEFAULT_MAX_BODY_BYTES = 64 * 1024
"""The largest request body the API reads (bigger ones are refused with 413)."""
ALL_FLOWS = "*"
"""In a user's ``start`` list: every ``@startable_by_rpc`` flow of the node's CorDapps."""

_ARGON2_HASH = re.compile(
    r"\$argon2(id|i|d)\$v=\d+\$m=\d+,t=\d+,p=\d+\$[A-Za-z0-9+/]+\$[A-Za-z0-9+/]+"
)
_USER_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_SECTION_FIELDS = {
    "address": str,
    "port": int,
    "tls_certificate": str,
    "tls_key": str,
    "allow_plain_non_loopback": bool,
    "max_body_bytes": int,
    "worker_ports": dict,
    "users": list,
}
_USER_FIELDS = {
    "name": str,
    "password_hash": str,
    "token_hash": str,
    "start": list,
    "observe": bool,
    "operate": bool,
}
REQUIRED_PACKAGES = ("starlette", "uvicorn", "argon2", "httpx", "jinja2")
"""What serving the API needs: fiberflow's ``rpc`` extra."""


@attrs.frozen
class RpcUser:
    """A user of the API and what it may do."""

    name: str
    password_hash: str | None = None
    """The argon2 hash of its password (HTTP Basic), or None for a token user."""
    token_hash: str | None = None
    """The argon2 hash of its API token (``Authorization: Bearer``), or None."""
    start: tuple[str, ...] = ()
    """Qualified names of the flow classes it may start; ``"*"``: every startable flow."""
    observe: bool = False
    """May it read flows, their progress and the node's state."""
    operate: bool = False
    """May it kill, pause, resume and retry flows, and drain or undrain the node."""

    def may_start(self, flow_class: str) -> bool:
        """True if the user's ``start`` list allows ``flow_class`` (a qualified name).

        The class must also be ``@startable_by_rpc`` and one of the node's flows: the API
        checks that apart (:mod:`flows.rpc.app`).
        """
        return ALL_FLOWS in self.start or flow_class in self.start


@attrs.frozen
class RpcConfig:
    """The ``[rpc]`` section, checked (see the module docstring)."""

    port: int
    address: str = DEFAULT_ADDRESS
    tls_certificate: Path | None = None
    tls_key: Path | None = None
    allow_plain_non_loopback: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    worker_ports: dict[str, int] = attrs.field(factory=dict)
    """For a node run by several workers: the workers that serve the API, each on its port."""
    users: tuple[RpcUser, ...] = ()

    @property
    def tls(self) -> bool:
        """True if the API is served over HTTPS."""
        return self.tls_certificate is not None

    def port_for(self, worker: str | None) -> int | None:
        """The port this process serves on (None: it serves no API).

        A single node process serves on ``port``. A worker of a node run by several workers
        serves only if ``worker_ports`` names it; see :func:`worker_problem`.
        """
        if worker is None:
            return self.port
        return self.worker_ports.get(worker)

    def worker_problem(self, worker: str | None) -> str | None:
        """Why the API setup is ambiguous for ``worker``, or None.

        Every worker reads the same config: without ``worker_ports`` they would all bind
        ``port``, so a worker refuses to start until the config says which workers serve.
        """
        if worker is not None and not self.worker_ports:
            return (
                "field 'rpc.worker_ports': missing: a node run by several workers names the "
                "workers that serve the API and their ports (e.g. worker_ports = { w1 = 8081 })"
            )
        return None


def is_loopback(address: str) -> bool:
    """True if ``address`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def missing_package() -> str | None:
    """The first package of the ``rpc`` extra that is not installed, or None."""
    for name in REQUIRED_PACKAGES:
        if importlib.util.find_spec(name) is None:
            return name
    return None


def parse_rpc_section(
    table: dict[str, Any], base: Path, fail: Callable[[str, str], Exception]
) -> RpcConfig:
    """Check the ``[rpc]`` table (files relative to ``base``); ``fail(field, problem)``."""
    for field in sorted(table):
        expected = _SECTION_FIELDS.get(field)
        if expected is None:
            known = ", ".join(sorted(_SECTION_FIELDS))
            raise fail(f"rpc.{field}", f"unknown field (known: {known})")
        if not isinstance(table[field], expected) or (
            expected is int and isinstance(table[field], bool)
        ):
            raise fail(f"rpc.{field}", f"must be a {expected.__name__}, not {table[field]!r}")
    missing = missing_package()
    if missing is not None:
        raise fail(
            "rpc",
            f"needs fiberflow's rpc extra (pip install 'fiberflow[rpc]'): "
            f"{missing} is not installed",
        )
    if "port" not in table:
        raise fail("rpc.port", "missing (required in [rpc]; 0: any free port)")
    port = table["port"]
    if not 0 <= port <= 65535:
        raise fail("rpc.port", f"must be 0 to 65535, not {port}")
    address = table.get("address", DEFAULT_ADDRESS)
    if not address:
        raise fail("rpc.address", "must not be empty")
    certificate, key = table.get("tls_certificate"), table.get("tls_key")
    if (certificate is None) != (key is None):
        raise fail(
            "rpc.tls_key" if key is None else "rpc.tls_certificate",
            "missing: tls_certificate and tls_key go together",
        )
    allow_plain = table.get("allow_plain_non_loopback", False)
    if certificate is None and not is_loopback(address) and not allow_plain:
        raise fail(
            "rpc.address",
            f"{address} is not a loopback address: serving it without TLS sends passwords in "
            "clear; give tls_certificate and tls_key, or set allow_plain_non_loopback = true",
        )
    max_body = table.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    if max_body < 1024:
        raise fail("rpc.max_body_bytes", f"must be at least 1024, not {max_body}")
    worker_ports: dict[str, int] = {}
    for worker, value in table.get("worker_ports", {}).items():
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
            raise fail(f"rpc.worker_ports.{worker}", f"must be a port (0 to 65535), not {value!r}")
        worker_ports[worker] = value
    users = tuple(_user(entry, index, fail) for index, entry in enumerate(table.get("users", [])))
    names = [user.name for user in users]
    for name in names:
        if names.count(name) > 1:
            raise fail("rpc.users", f"user {name!r} is listed twice")
    return RpcConfig(
        port=port,
        address=address,
        tls_certificate=None if certificate is None else base / certificate,
        tls_key=None if key is None else base / key,
        allow_plain_non_loopback=allow_plain,
        max_body_bytes=max_body,
        worker_ports=worker_ports,
        users=users,
    )


def _user(entry: Any, index: int, fail: Callable[[str, str], Exception]) -> RpcUser:
    """One ``[[rpc.users]]`` entry, checked."""
    where = f"rpc.users[{index}]"
    if not isinstance(entry, dict):
        raise fail(where, "must be a table ([[rpc.users]])")
    for field in sorted(entry):
        expected = _USER_FIELDS.get(field)
        if expected is None:
            raise fail(f"{where}.{field}", f"unknown field (known: {', '.join(_USER_FIELDS)})")
        if not isinstance(entry[field], expected):
            raise fail(f"{where}.{field}", f"must be a {expected.__name__}, not {entry[field]!r}")
    name = entry.get("name")
    if name is None:
        raise fail(f"{where}.name", "missing (required)")
    if not _USER_NAME.fullmatch(name):
        raise fail(f"{where}.name", "1 to 64 letters, digits, '_', '.', '@' or '-'")
    where = f"rpc.users[{name}]"
    secrets = [field for field in ("password_hash", "token_hash") if field in entry]
    if len(secrets) != 1:
        raise fail(where, "needs exactly one of password_hash and token_hash")
    secret = entry[secrets[0]]
    if not _ARGON2_HASH.fullmatch(secret):
        raise fail(
            f"{where}.{secrets[0]}",
            "not an argon2 hash (make one with `fiberflow rpc hash-password` or "
            "`fiberflow rpc new-token`)",
        )
    start = entry.get("start", [])
    for item in start:
        if not isinstance(item, str) or not item:
            raise fail(
                f"{where}.start", f"must list qualified flow class names or '*', not {item!r}"
            )
        if item != ALL_FLOWS and "." not in item:
            raise fail(
                f"{where}.start",
                f"{item!r} is not a qualified class name (module.Class), nor '*'",
            )
    return RpcUser(
        name=name,
        password_hash=entry.get("password_hash"),
        token_hash=entry.get("token_hash"),
        start=tuple(start),
        observe=entry.get("observe", False),
        operate=entry.get("operate", False),
    )
