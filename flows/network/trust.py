"""The network trust root (the "doorman"): who may be a node of the network, under which key.

Without a root, whoever can write the network map directory can bind any name to any key.
With one, the binding is an X.509 certificate: the network operator keeps an Ed25519 root
key offline and issues each node a certificate for its X.500 name and its Ed25519 identity
key, directly (no intermediate certificates). Each node signs its node-info with its key;
a node-info counts only if its certificate chains to the root and its signature verifies.

This module is the nodes' side: :class:`NetworkRoot` checks certificates and node-infos.
The operator's side (creating the root, certificate requests, issuing) is
:mod:`flows.network.doorman`. The steps (``fiberflow network ...`` runs each,
:mod:`flows.cli.network`):

1. the operator creates the root once: :meth:`~flows.network.doorman.RootAuthority.create` writes
   ``network-root.key.pem`` (mode 0600) and the self-signed ``network-root.cert.pem``;
2. each node makes a certificate request from its key file
   (:func:`~flows.network.doorman.certificate_request`);
3. the operator checks and issues it: :meth:`~flows.network.doorman.RootAuthority.issue`;
4. the node starts with ``network_root`` (the root certificate) and ``certificate`` in its
   config; it publishes its node-info with the certificate, signed
   (:meth:`~flows.network.map.NodeInfo.signed_by`), and trusts only the node-infos that
   :meth:`NetworkRoot.verify_node_info` accepts.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.x509.oid import NameOID

from flows.network.identity import NodeIdentity
from flows.network.map import NodeInfo, NodeInfoRejected
from flows.party import Party

__all__ = [
    "NetworkRoot",
    "NetworkTrustError",
    "NodeInfoRejected",
    "NodeTrust",
    "load_certificate",
    "party_name",
    "x509_name",
]


class NetworkTrustError(ValueError):
    """A root, request or certificate that cannot be used; the message says which and why."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    return constraints.value.ca


_ATTRIBUTES = {
    "CN": NameOID.COMMON_NAME,
    "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
    "O": NameOID.ORGANIZATION_NAME,
    "L": NameOID.LOCALITY_NAME,
    "ST": NameOID.STATE_OR_PROVINCE_NAME,
    "C": NameOID.COUNTRY_NAME,
}


def x509_name(party_name: str) -> x509.Name:
    """The X.509 name certifying party ``party_name`` (ValueError if it is not a party name).

    The same as ``x509.Name.from_rfc4514_string`` of the name, but built from the party's
    parts, so spaces after commas and characters RFC 4514 escapes are taken as the party
    name means them.
    """
    Party(party_name)
    parts = [item.strip().partition("=") for item in party_name.split(",")]
    try:
        return x509.Name(
            [x509.NameAttribute(_ATTRIBUTES[key], value.strip()) for key, _, value in parts[::-1]]
        )
    except ValueError as error:
        raise ValueError(f"party name {party_name!r} cannot be an X.509 name: {error}") from None


def party_name(name: x509.Name) -> str:
    """The party name an X.509 name certifies (ValueError if it certifies no party name)."""
    keys = {oid: key for key, oid in _ATTRIBUTES.items()}
    parts = []
    for rdn in reversed(name.rdns):
        attributes = list(rdn)
        if len(attributes) != 1 or attributes[0].oid not in keys:
            raise ValueError(f"{name.rfc4514_string()} is not a party name")
        parts.append(f"{keys[attributes[0].oid]}={attributes[0].value!s}")
    text = ",".join(parts)
    Party(text)
    return text


def load_certificate(path: str | Path, what: str = "certificate") -> x509.Certificate:
    """The PEM certificate in ``path``; :class:`NetworkTrustError` naming the file if not."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise NetworkTrustError(f"{what} {path}: cannot read it: {error.strerror}") from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as error:
        raise NetworkTrustError(f"{what} {path}: not a PEM X.509 certificate: {error}") from None


def _check_subject_and_key(
    certificate: x509.Certificate, name: str, public_key: bytes | str | None
) -> None:
    """Raise :class:`NodeInfoRejected` unless ``certificate`` is for ``name`` and its key."""
    try:
        wanted: x509.Name | None = x509_name(name)
    except ValueError:
        wanted = None
    if certificate.subject != wanted:
        try:
            subject = party_name(certificate.subject)
        except ValueError:
            subject = certificate.subject.rfc4514_string()
        raise NodeInfoRejected(f"certificate is for {subject}, not {name}")
    certified = certificate.public_key()
    if not isinstance(certified, Ed25519PublicKey):
        raise NodeInfoRejected(
            f"the certified key is a {type(certified).__name__}, not an Ed25519 key"
        )
    if public_key is None:
        raise NodeInfoRejected("the node-info has no public key")
    try:
        raw = bytes.fromhex(public_key) if isinstance(public_key, str) else public_key
    except ValueError:
        raise NodeInfoRejected("the node-info's public key is not hex") from None
    if raw != _raw(certified):
        raise NodeInfoRejected("public key does not match the certificate")


class NetworkRoot:
    """The network's root certificate, as every node holds it: it checks node-infos."""

    def __init__(self, certificate: x509.Certificate) -> None:
        public_key = certificate.public_key()
        if not isinstance(public_key, Ed25519PublicKey):
            raise NetworkTrustError(
                f"root certificate {certificate.subject.rfc4514_string()}: its key is a "
                f"{type(public_key).__name__}, not Ed25519"
            )
        if not _is_ca(certificate):
            raise NetworkTrustError(
                f"root certificate {certificate.subject.rfc4514_string()} is not a CA certificate"
            )
        try:
            public_key.verify(certificate.signature, certificate.tbs_certificate_bytes)
        except InvalidSignature:
            raise NetworkTrustError(
                f"root certificate {certificate.subject.rfc4514_string()} is not self-signed"
            ) from None
        self.certificate = certificate
        """The root certificate."""
        self.public_key: Ed25519PublicKey = public_key
        """The root's public key: every node certificate must be signed with it."""

    @classmethod
    def load(cls, path: str | Path) -> NetworkRoot:
        """The root whose certificate is the PEM file ``path``."""
        try:
            return cls(load_certificate(path, "network root certificate"))
        except NetworkTrustError as error:
            message = str(error)
            if message.startswith("root certificate"):
                message = f"network root {path}: {message}"
            raise NetworkTrustError(message) from None

    @property
    def subject(self) -> str:
        """The root certificate's subject (RFC 4514 text)."""
        return self.certificate.subject.rfc4514_string()

    def check_certificate(
        self,
        certificate: x509.Certificate | str | bytes,
        name: str,
        public_key: bytes | str | None,
        now: datetime.datetime | None = None,
    ) -> None:
        """Check that ``certificate`` certifies ``public_key`` (raw or hex) as node ``name``.

        It must be issued by this root (signed with its key), valid at ``now`` (default:
        the present), not a CA, for exactly ``name`` and ``public_key``. Raises
        :class:`NodeInfoRejected` saying what is wrong.
        """
        if not isinstance(certificate, x509.Certificate):
            pem = certificate.encode() if isinstance(certificate, str) else certificate
            try:
                certificate = x509.load_pem_x509_certificate(pem)
            except ValueError as error:
                raise NodeInfoRejected(f"the certificate is not PEM X.509: {error}") from None
        try:
            self._check(certificate, name, public_key, _now() if now is None else now)
        except NodeInfoRejected:
            raise
        except (ValueError, UnsupportedAlgorithm) as error:  # malformed names, extensions, keys
            raise NodeInfoRejected(f"the certificate cannot be read: {error}") from None

    def _check(
        self,
        certificate: x509.Certificate,
        name: str,
        public_key: bytes | str | None,
        now: datetime.datetime,
    ) -> None:
        issuer = certificate.issuer.rfc4514_string()
        if certificate.issuer != self.certificate.subject:
            raise NodeInfoRejected(
                f"certificate issued by another root ({issuer}, not {self.subject})"
            )
        try:
            self.public_key.verify(certificate.signature, certificate.tbs_certificate_bytes)
        except InvalidSignature:
            raise NodeInfoRejected(
                f"certificate issued by another root: named {issuer} but its signature does "
                "not verify with this network's root key"
            ) from None
        if certificate == self.certificate:
            raise NodeInfoRejected("the certificate is the network root itself, not a node's")
        if _is_ca(certificate):
            raise NodeInfoRejected("the certificate is a CA certificate, not a node's")
        root_end = self.certificate.not_valid_after_utc
        if now > root_end:
            raise NodeInfoRejected(
                f"the network root certificate expired on {root_end:%Y-%m-%d %H:%M} UTC"
            )
        start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
        if now < start:
            raise NodeInfoRejected(f"certificate not valid before {start:%Y-%m-%d %H:%M} UTC")
        if now > end:
            raise NodeInfoRejected(f"certificate expired on {end:%Y-%m-%d %H:%M} UTC")
        try:
            usage = certificate.extensions.get_extension_for_class(x509.KeyUsage).value
        except x509.ExtensionNotFound:
            usage = None
        if usage is not None and not usage.digital_signature:
            raise NodeInfoRejected("the certificate does not allow digital signatures")
        _check_subject_and_key(certificate, name, public_key)

    def verify_node_info(self, info: NodeInfo, now: datetime.datetime | None = None) -> None:
        """Check a node-info: certified by this root (:meth:`check_certificate`) and signed.

        Raises :class:`NodeInfoRejected` saying what is wrong.
        """
        if info.certificate is None:
            raise NodeInfoRejected("no certificate: the network has a root, and it issued none")
        self.check_certificate(info.certificate, info.name, info.public_key, now)
        assert info.public_key is not None  # the certificate check made sure
        if info.signature is None:
            raise NodeInfoRejected("not signed by the node")
        try:
            signature = bytes.fromhex(info.signature)
        except ValueError:
            raise NodeInfoRejected("the signature is not hex") from None
        public_key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(info.public_key))
        try:
            public_key.verify(signature, info.signed_bytes())
        except (InvalidSignature, ValueError):
            raise NodeInfoRejected(
                "signature does not verify: the node-info was changed after it was signed"
            ) from None


@attrs.frozen
class NodeTrust:
    """What a node process starts with: the root it trusts (if any) and its own certificate."""

    root: NetworkRoot | None = None
    """The network root; None: every node-info is taken as it is."""
    certificate: str | None = None
    """The PEM text of the node's certificate, published in its node-info (None: none)."""

    @classmethod
    def load(
        cls, network_root: Path | None, certificate: Path | None, identity: NodeIdentity
    ) -> NodeTrust:
        """Load the configured files and check the node's certificate against them.

        The certificate must be for ``identity``'s name and key and, with a root, chain to it
        and be valid now. Raises :class:`NetworkTrustError` with one line naming the file and
        the problem.
        """
        if network_root is not None and certificate is None:
            raise NetworkTrustError("a node with a network root needs its certificate")
        root = None if network_root is None else NetworkRoot.load(network_root)
        if certificate is None:
            return cls(root, None)
        loaded = load_certificate(certificate, "node certificate")
        try:
            if root is None:
                _check_subject_and_key(loaded, identity.name, identity.public_key)
            else:
                root.check_certificate(loaded, identity.name, identity.public_key)
        except NodeInfoRejected as error:
            where = "" if network_root is None else f" for the network root {network_root}"
            raise NetworkTrustError(
                f"node certificate {certificate} is not valid{where}: {error.reason}"
            ) from None
        pem = loaded.public_bytes(serialization.Encoding.PEM).decode()
        return cls(root, pem)
