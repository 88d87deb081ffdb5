"""``fiberflow network ...``: the network trust root's commands (operator and node side).

- ``create-root --out DIR``: a new root key (0600) and self-signed root certificate;
- ``request --config node.toml --out FILE``: a node's certificate request, from its key file;
- ``issue --root-dir DIR --csr FILE --out FILE``: the operator issues the node's certificate;
- ``issue-tls --root-dir DIR --host H [--host H ...] --out-cert FILE --out-key FILE``: a new
  key (0600) and a TLS server certificate from the root for a broker reachable as those hosts;
- ``node-info --config node.toml [--out DIR]``: the node's node-info, certified and signed by
  its key, written without starting the node (to hand to other organisations first);
- ``verify --root CERT [--network-map DIR]``: each node-info file, accepted or refused.

Errors are one line on stderr and exit status 2; ``verify`` exits 1 if any file is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from flows.config.runtime import ConfigError, load_config
from flows.network.doorman import (
    DEFAULT_NODE_DAYS,
    DEFAULT_ROOT_DAYS,
    DEFAULT_ROOT_SUBJECT,
    DEFAULT_TLS_DAYS,
    ROOT_CERTIFICATE_FILE,
    ROOT_KEY_FILE,
    RootAuthority,
    certificate_request,
    new_tls_server_key,
    write_new_file,
)
from flows.network.identity import KeyFileError, load_or_create_identity
from flows.network.map import NetworkMap
from flows.network.trust import NetworkRoot, NetworkTrustError, NodeTrust

__all__ = ["add_network_arguments", "run_network_command"]


def add_network_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``network`` subcommands and their options."""
    commands = parser.add_subparsers(dest="network_command", required=True)
    create = commands.add_parser(
        "create-root",
        help="create the network root key and certificate (operator, once)",
        description=f"Write DIR/{ROOT_KEY_FILE} (mode 0600; keep it offline) and "
        f"DIR/{ROOT_CERTIFICATE_FILE} (give it to every node). Never overwrites.",
    )
    create.add_argument("--out", type=Path, required=True, metavar="DIR", help="root directory")
    create.add_argument(
        "--name", default=DEFAULT_ROOT_SUBJECT, help=f"root subject ({DEFAULT_ROOT_SUBJECT!r})"
    )
    create.add_argument(
        "--days", type=int, default=DEFAULT_ROOT_DAYS, help=f"validity ({DEFAULT_ROOT_DAYS})"
    )
    request = commands.add_parser(
        "request",
        help="write a node's certificate request (node)",
        description="A certificate request for the node's name and its key file's key "
        "(the key file is created if absent). Send it to the network operator.",
    )
    request.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    request.add_argument("--out", type=Path, required=True, metavar="FILE", help="the request")
    issue = commands.add_parser(
        "issue",
        help="issue a node certificate from a request (operator)",
        description="Check a node's certificate request (signature, node name, Ed25519 key) "
        "and issue its certificate from the root, directly (no intermediate).",
    )
    issue.add_argument("--root-dir", type=Path, required=True, metavar="DIR", help="the root")
    issue.add_argument("--csr", type=Path, required=True, metavar="FILE", help="the request")
    issue.add_argument("--out", type=Path, required=True, metavar="FILE", help="the certificate")
    issue.add_argument(
        "--days", type=int, default=DEFAULT_NODE_DAYS, help=f"validity ({DEFAULT_NODE_DAYS})"
    )
    tls = commands.add_parser(
        "issue-tls",
        help="a key and TLS server certificate for a broker's listener (operator)",
        description="Generate a key (Ed25519; written with mode 0600, never overwritten) and "
        "issue a TLS server certificate for it from the root, for every --host (DNS name or "
        "IP address) the broker is reached as; give both to the broker's TLS listener.",
    )
    tls.add_argument("--root-dir", type=Path, required=True, metavar="DIR", help="the root")
    tls.add_argument(
        "--host", action="append", required=True, metavar="HOST",
        help="a DNS name or IP address of the broker (repeat for each)",
    )  # fmt: skip
    tls.add_argument("--out-cert", type=Path, required=True, metavar="FILE", help="certificate")
    tls.add_argument("--out-key", type=Path, required=True, metavar="FILE", help="new key file")
    tls.add_argument(
        "--days", type=int, default=DEFAULT_TLS_DAYS, help=f"validity ({DEFAULT_TLS_DAYS})"
    )
    node_info = commands.add_parser(
        "node-info",
        help="write the node's signed node-info without starting it (node)",
        description="Write the node's node-info (its name, published inbound, public key, "
        "agreement key and certificate), signed by its key, into its network map directory or "
        "--out; copy it to the other organisations' network maps.",
    )
    node_info.add_argument("--config", type=Path, required=True, help="the node's TOML config")
    node_info.add_argument(
        "--out", type=Path, metavar="DIR", help="directory (default: the config's network_map)"
    )
    verify = commands.add_parser(
        "verify",
        help="check every node-info of a network map against the root",
        description="Print each node-info file as accepted or refused (with the reason); "
        "exit status 1 if any is refused.",
    )
    verify.add_argument("--root", type=Path, required=True, metavar="CERT", help="root cert")
    verify.add_argument(
        "--network-map", type=Path, default=Path("network-map"), metavar="DIR",
        help="the node-info directory (network-map)",
    )  # fmt: skip


def run_network_command(args: Any) -> int:
    """Run a parsed ``fiberflow network`` command; returns the exit status."""
    command = args.network_command
    try:
        if command == "create-root":
            return _create_root(args.out, args.name, args.days)
        if command == "request":
            return _request(args.config, args.out)
        if command == "issue":
            return _issue(args.root_dir, args.csr, args.out, args.days)
        if command == "issue-tls":
            return _issue_tls(args.root_dir, args.host, args.out_cert, args.out_key, args.days)
        if command == "node-info":
            return _node_info(args.config, args.out)
        return _verify(args.root, args.network_map)
    except (NetworkTrustError, ConfigError, KeyFileError) as error:
        print(f"fiberflow network {command}: {error}", file=sys.stderr)
    except OSError as error:
        print(f"fiberflow network {command}: {error.filename}: {error.strerror}", file=sys.stderr)
    return 2


def _create_root(directory: Path, subject: str, days: int) -> int:
    authority = RootAuthority.create(directory, subject, days)
    print(f"network root {authority.network_root().subject}")
    print(f"  key (keep offline, mode 0600): {directory / ROOT_KEY_FILE}")
    print(f"  certificate (give to every node): {directory / ROOT_CERTIFICATE_FILE}")
    return 0


def _request(config_path: Path, out: Path) -> int:
    config = load_config(config_path)
    if config.key_file is None:
        raise ConfigError(f"{config_path}: field 'key_file': not set")
    identity = load_or_create_identity(config.key_file, config.name)
    out.write_bytes(certificate_request(identity))
    print(f"certificate request for {config.name} (key {config.key_file}) written to {out}")
    return 0


def _issue(root_dir: Path, csr: Path, out: Path, days: int) -> int:
    authority = RootAuthority.load(root_dir)
    certificate = authority.issue(csr.read_bytes(), days)
    out.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    print(
        f"issued {out}: {certificate.subject.rfc4514_string()}, valid until "
        f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, serial "
        f"{certificate.serial_number:x}"
    )
    return 0


def _issue_tls(root_dir: Path, hosts: list[str], out_cert: Path, out_key: Path, days: int) -> int:
    authority = RootAuthority.load(root_dir)
    if out_key.exists():
        raise NetworkTrustError(f"{out_key} exists: refusing to overwrite a key")
    key = new_tls_server_key()
    certificate = authority.issue_tls_server(key.public_key(), hosts, days)
    write_new_file(
        out_key,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        0o600,
    )
    out_cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    print(
        f"issued {out_cert} (key {out_key}, mode 0600) for {', '.join(hosts)}, valid until "
        f"{certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, serial "
        f"{certificate.serial_number:x}"
    )
    return 0


def _node_info(config_path: Path, out: Path | None) -> int:
    config = load_config(config_path)
    if config.key_file is None:
        raise ConfigError(f"{config_path}: field 'key_file': not set")
    identity = load_or_create_identity(config.key_file, config.name)
    trust = NodeTrust.load(config.network_root, config.certificate, identity)
    directory = out or config.network_map
    if directory is None:
        raise ConfigError(f"{config_path}: field 'network_map': not set and no --out given")
    info = config.node_info(identity, trust.certificate)
    path = NetworkMap(directory).publish(info, identity=identity)
    certified = "certified, " if trust.certificate is not None else ""
    print(f"node-info of {config.name} ({certified}signed) written to {path}")
    print(f"  inbound: {info.transport}")
    print(f"  agreement key: {identity.agreement_key_hex}")
    return 0


def _verify(root_path: Path, directory: Path) -> int:
    root = NetworkRoot.load(root_path)
    if not directory.is_dir():
        raise NetworkTrustError(f"network map directory {directory} does not exist")
    scan = NetworkMap(directory, root).scan()
    lines = [(path, f"accepted: {info.name}") for path, info in scan.accepted]
    lines += [(path, f"refused: {reason}") for path, reason in scan.rejected]
    for path, text in sorted(lines):
        print(f"{path.name}: {text}")
    print(f"{len(scan.accepted)} accepted, {len(scan.rejected)} refused")
    return 1 if scan.rejected else 0
