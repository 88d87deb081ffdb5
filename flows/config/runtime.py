"""A node process's config file (TOML): its fields, their checks, :class:`RuntimeConfig`.

``fiberflow node run --config node.toml`` (:mod:`flows.process.process`) reads it. The fields::

    name = "O=Alice,L=London,C=GB"          # the node's X.500 name (required)
    database_url = "sqlite:///alice.db"      # required; relative SQLite paths are taken
                                             # relative to the config file's directory
    transport_url = "sqlite:///queue.db"     # required: sqlite, postgresql or amqp URL
    cordapps = ["samples.pingpong"]          # modules holding the node's flows
    network_map = "network-map"              # directory of node-info files (default)
    database_schema = "alice"                # optional, PostgreSQL only
    synchronous = "FULL"                     # optional, SQLite durability level
    status_file = "alice.status.json"        # optional: statistics, rewritten every second
    log_level = "INFO"                       # optional
    key_file = "alice.key.pem"               # optional: the node's Ed25519 key pair
    receive_timeout = 3600                   # optional: seconds, or "forever"
    operation_threads = 16                   # optional: threads for external operations
    hibernate_after = 60                     # optional: seconds a waiting flow keeps its
                                             # memory ("never": always; 0: not at all)
    memory_budget_mb = 1024                  # optional: above this resident memory, every
                                             # waiting flow hibernates at once
    limits = { max_bytes = 16777216, max_depth = 64 }   # optional: payload/message limits
    lease_seconds = 20                       # optional: the node lease's length
    database_wait_seconds = 60               # optional: wait this long for the database
    busy_warning_seconds = 5                 # optional: log flows running this long
    network_root = "root.cert.pem"           # optional: the network's root certificate
    certificate = "alice.cert.pem"           # the node's certificate (required with a root)
    topology = "shared"                      # optional: "shared" (every node sends through
                                             # transport_url) or "p2p" (transport_url is this
                                             # node's own inbound; bridges send to each
                                             # peer's published inbound)
    former_inbounds = ["amqp://..."]         # optional, p2p: inbounds this node moved away
                                             # from; it drains them until they are removed
    require_tls = false                      # optional, p2p: send only to peers whose inbound
                                             # is TLS-verified (amqps://, sslmode=verify-full)
    [metrics]                                # optional: serve Prometheus metrics at
    address = "127.0.0.1"                    # http://address:port/metrics (the default
    port = 9464                              # address; port required, 0: any free port)
    [bridge_credentials."O=Bob,L=New York,C=US"]   # optional, p2p: how this node logs into
    user = "alice"                                 # a peer's transport ("*": any peer not
    password = "secret"                            # named); the peer's operator made them
    [rpc]                                    # optional: the node's HTTP API and its users
    port = 8080                              # (flows.config.rpc, docs/rpc.md)

With ``network_root`` the node trusts only node-infos certified by that root and signed by
their node (:mod:`flows.network.trust`), and ``certificate`` (issued to it by the root) is
required; at start the node checks that its certificate is for its name and key and chains
to the root, and refuses to start otherwise. ``certificate`` alone publishes the node-info
certified and signed without checking others' (a network moving to a root).

Connections to ``amqps://`` addresses (bridges to peers, and the node's own inbound) verify
the broker's certificate against ``network_root`` only (without one: the system's trust
store) and its host name, and present ``certificate`` with the key of ``key_file`` as the
client certificate (:meth:`RuntimeConfig.tls_settings`).

A bad config fails at start with the file and the field named (:class:`ConfigError`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from flows.config.node import DEFAULT_HIBERNATE_AFTER, DEFAULT_RECEIVE_TIMEOUT, NodeConfig
from flows.config.rpc import ALL_FLOWS, RpcConfig, parse_rpc_section
from flows.cordapps import CordappError, Cordapps
from flows.markings import is_startable_by_rpc
from flows.network.map import NodeInfo, NodeInfoSigner, node_key
from flows.party import Party
from foundation.engine import database_url_problem
from foundation.serialization import DEFAULT_LIMITS, SerializationLimits
from messaging.codec import wire_limits_problem
from messaging.peer_senders import Credentials, public_address
from messaging.tls import TlsSettings
from messaging.transports import TransportUrlError, transport_scheme
from persistence.lease import DEFAULT_LEASE_SECONDS

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "database_url": str,
    "transport_url": str,
    "cordapps": list,
    "network_map": str,
    "database_schema": str,
    "synchronous": str,
    "status_file": str,
    "log_level": str,
    "key_file": str,
    "receive_timeout": (int, float, str),
    "operation_threads": int,
    "hibernate_after": (int, float, str),
    "memory_budget_mb": int,
    "limits": dict,
    "lease_seconds": (int, float),
    "database_wait_seconds": (int, float),
    "busy_warning_seconds": (int, float),
    "network_root": str,
    "certificate": str,
    "topology": str,
    "bridge_credentials": dict,
    "former_inbounds": list,
    "require_tls": bool,
    "metrics": dict,
    "rpc": dict,
}
_REQUIRED = ("name", "database_url", "transport_url")


class ConfigError(ValueError):
    """A node config that cannot be used; the message names the file and the field."""


TOPOLOGIES = ("shared", "p2p")
"""How a node reaches its peers: through one shared transport, or by bridges to each
peer's own inbound (:mod:`messaging.bridges`)."""

DEFAULT_BUSY_WARNING_SECONDS = 5.0
"""A flow whose code runs this long without suspending is logged (and shown as RUNNING)."""
DEFAULT_DATABASE_WAIT_SECONDS = 60.0
"""How long a starting node retries a database that refuses connections."""


@attrs.frozen
class MetricsSettings:
    """Where a node process serves its Prometheus metrics (the ``[metrics]`` section)."""

    port: int
    """The TCP port (0: one the OS picks, logged at start)."""
    address: str = "127.0.0.1"
    """The address to listen on (the default: this machine only)."""


@attrs.frozen
class RuntimeConfig:
    """A node process's configuration (see the module docstring)."""

    name: str
    database_url: str
    transport_url: str
    cordapps: tuple[str, ...] = ()
    network_map: Path | None = None
    database_schema: str | None = None
    synchronous: str = "FULL"
    status_file: Path | None = None
    log_level: str = "INFO"
    key_file: Path | None = None
    """The node's Ed25519 key pair (PEM, mode 0600), created at first start."""
    receive_timeout: float | None = DEFAULT_RECEIVE_TIMEOUT
    """Seconds a receive waits when the flow gives no timeout (None: forever)."""
    limits: SerializationLimits = DEFAULT_LIMITS
    """What payloads and session messages may be (size, depth, lengths), both ways."""
    operation_threads: int = 16
    """Threads running flows' external operations at once."""
    hibernate_after: float | None = DEFAULT_HIBERNATE_AFTER
    """Seconds a waiting flow keeps its memory before it hibernates (None: for ever)."""
    memory_budget_mb: int | None = None
    """Above this resident memory (MiB), every waiting flow hibernates at once."""
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """How long the node lease lasts without renewal (renewed every second at most)."""
    database_wait_seconds: float = DEFAULT_DATABASE_WAIT_SECONDS
    """How long a starting node waits for an unreachable database before giving up."""
    busy_warning_seconds: float = DEFAULT_BUSY_WARNING_SECONDS
    """A flow whose code runs this long without suspending is logged and listed."""
    network_root: Path | None = None
    """The network root's certificate (PEM): only node-infos it certifies are trusted."""
    certificate: Path | None = None
    """The node's certificate (PEM), issued by the network root; published in its node-info."""
    topology: str = "shared"
    """``shared``: every node sends through ``transport_url``; ``p2p``: ``transport_url``
    is this node's own inbound and bridges send to each peer's published inbound."""
    bridge_credentials: dict[str, Credentials] = attrs.field(factory=dict)
    """How this node logs into peers' transports, by peer name (``"*"``: any other)."""
    require_tls: bool = False
    """Send only to peers whose published inbound is reached over verified TLS."""
    former_inbounds: tuple[str, ...] = ()
    """Inbounds this node moved away from: it keeps consuming them (peers may have sent
    there before they saw its new address) until the operator removes them."""
    metrics: MetricsSettings | None = None
    """Where to serve Prometheus metrics (None: not served, ``prometheus_client`` not loaded)."""
    rpc: RpcConfig | None = None
    """The node's HTTP API (``[rpc]``), or None: the node serves none."""

    def tls_settings(self) -> TlsSettings:
        """What the node's ``amqps://`` connections trust and present (:mod:`messaging.tls`).

        The network root (if any) is the only trust anchor, else the system's trust store;
        the node's certificate and identity key (if it has a certificate) are its client
        certificate.
        """
        return TlsSettings(
            trust=self.network_root,
            certificate=self.certificate,
            key_file=self.key_file if self.certificate is not None else None,
        )

    def node_info(self, identity: NodeInfoSigner, certificate: str | None) -> NodeInfo:
        """The node's entry in the network map (unsigned): its name, inbound and keys.

        The keys are ``identity``'s Ed25519 public key and X25519 agreement key. The inbound
        is published without credentials (:func:`public_address`).
        """
        return NodeInfo(
            name=self.name,
            address=self.name,
            transport=public_address(self.transport_url),
            public_key=identity.public_key_hex,
            agreement_key=identity.agreement_key_hex,
            certificate=certificate,
        )

    def node_config(self) -> NodeConfig:
        """The :class:`NodeConfig` of the node."""
        return NodeConfig(
            name=self.name,
            database_url=self.database_url,
            cordapps=self.cordapps,
            synchronous=self.synchronous,
            database_schema=self.database_schema,
            receive_timeout=self.receive_timeout,
            lease_seconds=self.lease_seconds,
            limits=self.limits,
            operation_threads=self.operation_threads,
            hibernate_after=self.hibernate_after,
            memory_budget_mb=self.memory_budget_mb,
        )


def load_config(path: str | Path) -> RuntimeConfig:
    """Read and check a node config file; raises :class:`ConfigError` naming the problem."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config: {error}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from error
    return config_from_mapping(document, path.resolve().parent, str(path))


def config_from_mapping(
    document: dict[str, Any], base: Path, source: str = "config"
) -> RuntimeConfig:
    """Check a parsed config (paths relative to ``base``); see :func:`load_config`."""

    def fail(field: str, problem: str) -> ConfigError:
        return ConfigError(f"{source}: field {field!r}: {problem}")

    unknown = sorted(set(document) - set(_FIELDS))
    if unknown:
        raise fail(unknown[0], f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    for field in _REQUIRED:
        if field not in document:
            raise fail(field, "missing (required)")
    for field, expected in _FIELDS.items():
        if field in document and not isinstance(document[field], expected):
            names = " or ".join(
                t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,))
            )
            raise fail(field, f"must be a {names}, not {document[field]!r}")
    try:
        Party(document["name"])
    except ValueError as error:
        raise fail("name", str(error)) from None
    cordapps = tuple(document.get("cordapps", ()))
    if not all(isinstance(c, str) for c in cordapps):
        raise fail("cordapps", "must be a list of module names")
    try:
        installed = Cordapps(cordapps)
    except CordappError as error:
        raise fail("cordapps", str(error)) from None
    database_url = _resolve_sqlite(document["database_url"], base)
    problem = database_url_problem(database_url)
    if problem is not None:
        raise fail("database_url", problem)
    transport_url = _resolve_sqlite(document["transport_url"], base)
    try:
        transport_scheme(transport_url)
    except TransportUrlError as error:
        raise fail("transport_url", str(error)) from None
    synchronous = document.get("synchronous", "FULL")
    if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise fail("synchronous", "must be OFF, NORMAL, FULL or EXTRA")
    level = document.get("log_level", "INFO").upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise fail("log_level", "must be DEBUG, INFO, WARNING or ERROR")
    schema = document.get("database_schema")
    if schema is not None and not database_url.startswith("postgres"):
        raise fail("database_schema", "is for PostgreSQL databases only")
    network_map = base / document.get("network_map", "network-map")
    status_file = document.get("status_file")
    key_file = base / document.get("key_file", f"{node_key(document['name'])}.key.pem")
    receive_timeout: float | None = DEFAULT_RECEIVE_TIMEOUT
    if "receive_timeout" in document:
        value = document["receive_timeout"]
        if value == "forever":
            receive_timeout = None
        elif isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            receive_timeout = float(value)
        else:
            raise fail("receive_timeout", 'must be positive seconds or "forever"')
    operation_threads = document.get("operation_threads", 16)
    if isinstance(operation_threads, bool) or operation_threads < 1:
        raise fail("operation_threads", "must be a whole number of at least 1")
    hibernate_after: float | None = DEFAULT_HIBERNATE_AFTER
    if "hibernate_after" in document:
        value = document["hibernate_after"]
        if value == "never":
            hibernate_after = None
        elif isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            hibernate_after = float(value)
        else:
            raise fail("hibernate_after", 'must be zero or positive seconds, or "never"')
    memory_budget_mb = document.get("memory_budget_mb")
    if memory_budget_mb is not None and (
        isinstance(memory_budget_mb, bool) or memory_budget_mb < 1
    ):
        raise fail("memory_budget_mb", "must be a whole number of MiB, at least 1")
    limits = DEFAULT_LIMITS
    if "limits" in document:
        known = {f.name for f in attrs.fields(SerializationLimits)}
        unknown_limits = sorted(set(document["limits"]) - known)
        if unknown_limits:
            raise fail("limits", f"unknown limit {unknown_limits[0]!r} (known: {sorted(known)})")
        try:
            limits = SerializationLimits(**document["limits"])
        except (TypeError, ValueError) as error:
            raise fail("limits", str(error)) from None
        problem = wire_limits_problem(limits)
        if problem is not None:
            raise fail("limits", problem)
    lease_seconds = document.get("lease_seconds", DEFAULT_LEASE_SECONDS)
    if isinstance(lease_seconds, bool) or not lease_seconds > 0:
        raise fail("lease_seconds", "must be positive seconds")
    database_wait = document.get("database_wait_seconds", DEFAULT_DATABASE_WAIT_SECONDS)
    if isinstance(database_wait, bool) or not database_wait >= 0:
        raise fail("database_wait_seconds", "must be zero or positive seconds")
    busy_warning = document.get("busy_warning_seconds", DEFAULT_BUSY_WARNING_SECONDS)
    if isinstance(busy_warning, bool) or not busy_warning > 0:
        raise fail("busy_warning_seconds", "must be positive seconds")
    if "network_root" in document and "certificate" not in document:
        raise fail("certificate", "missing: required when 'network_root' is set")
    network_root = document.get("network_root")
    certificate = document.get("certificate")
    topology = document.get("topology", "shared")
    if topology not in TOPOLOGIES:
        raise fail("topology", f"must be {' or '.join(TOPOLOGIES)}, not {topology!r}")
    credentials = _bridge_credentials(document.get("bridge_credentials", {}), fail)
    if credentials and topology != "p2p":
        raise fail("bridge_credentials", 'is for topology = "p2p" only')
    former_inbounds = tuple(
        _resolve_sqlite(url, base) if isinstance(url, str) else url
        for url in document.get("former_inbounds", ())
    )
    require_tls = document.get("require_tls", False)
    if require_tls and topology != "p2p":
        raise fail("require_tls", 'is for topology = "p2p" only')
    if former_inbounds and topology != "p2p":
        raise fail("former_inbounds", 'is for topology = "p2p" only')
    for url in former_inbounds:
        if not isinstance(url, str):
            raise fail("former_inbounds", f"must be a list of transport URLs, not {url!r}")
        try:
            transport_scheme(url)
        except TransportUrlError as error:
            raise fail("former_inbounds", str(error)) from None
        if url == transport_url:
            raise fail("former_inbounds", "lists the current transport_url")
    metrics = _metrics_settings(document.get("metrics"), fail)
    rpc = None
    if "rpc" in document:
        rpc = parse_rpc_section(document["rpc"], base, fail)
        _check_startable(rpc, installed, fail)
    return RuntimeConfig(
        name=document["name"],
        database_url=database_url,
        transport_url=transport_url,
        cordapps=cordapps,
        network_map=network_map,
        database_schema=schema,
        synchronous=synchronous,
        status_file=None if status_file is None else base / status_file,
        log_level=level,
        key_file=key_file,
        receive_timeout=receive_timeout,
        operation_threads=operation_threads,
        hibernate_after=hibernate_after,
        memory_budget_mb=memory_budget_mb,
        limits=limits,
        lease_seconds=float(lease_seconds),
        database_wait_seconds=float(database_wait),
        busy_warning_seconds=float(busy_warning),
        network_root=None if network_root is None else base / network_root,
        certificate=None if certificate is None else base / certificate,
        topology=topology,
        bridge_credentials=credentials,
        former_inbounds=former_inbounds,
        require_tls=require_tls,
        metrics=metrics,
        rpc=rpc,
    )


def _check_startable(
    rpc: RpcConfig, installed: Cordapps, fail: Callable[[str, str], ConfigError]
) -> None:
    """Each class a user's ``start`` names must be a ``@startable_by_rpc`` flow of the node."""
    for user in rpc.users:
        for name in user.start:
            if name == ALL_FLOWS:
                continue
            cls = installed.flow_class(name)
            if cls is None:
                raise fail(f"rpc.users[{user.name}].start", f"{name} is not a flow in cordapps")
            if not is_startable_by_rpc(cls):
                raise fail(
                    f"rpc.users[{user.name}].start", f"{name} is not marked @startable_by_rpc"
                )


def _metrics_settings(
    table: dict[str, Any] | None, fail: Callable[[str, str], ConfigError]
) -> MetricsSettings | None:
    """The ``[metrics]`` section checked: a port (0 to 65535) and an optional address."""
    if table is None:
        return None
    unknown = sorted(set(table) - {"address", "port"})
    if unknown:
        raise fail(f"metrics.{unknown[0]}", "unknown field (known: address, port)")
    if "port" not in table:
        raise fail("metrics.port", "missing (required in [metrics])")
    port = table["port"]
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise fail("metrics.port", f"must be a port number from 0 to 65535, not {port!r}")
    address = table.get("address", "127.0.0.1")
    if not isinstance(address, str) or not address:
        raise fail("metrics.address", f"must be a host name or IP address, not {address!r}")
    return MetricsSettings(port=port, address=address)


def _bridge_credentials(
    table: dict[str, Any], fail: Callable[[str, str], ConfigError]
) -> dict[str, Credentials]:
    """The ``bridge_credentials`` table checked: peer name (or "*") -> user and password."""
    found: dict[str, Credentials] = {}
    for peer, entry in table.items():
        field = f"bridge_credentials.{peer}"
        if peer != "*":
            try:
                Party(peer)
            except ValueError as error:
                raise fail(field, f"not a node name or '*': {error}") from None
        if not isinstance(entry, dict) or set(entry) != {"user", "password"}:
            raise fail(field, "must be a table with exactly 'user' and 'password'")
        if not all(isinstance(value, str) and value for value in entry.values()):
            raise fail(field, "'user' and 'password' must be non-empty strings")
        found[peer] = Credentials(entry["user"], entry["password"])
    return found


def _resolve_sqlite(url: str, base: Path) -> str:
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        relative = url[len(prefix) :]
        if relative and relative != ":memory:":
            return prefix + str((base / relative).resolve())
    return url
