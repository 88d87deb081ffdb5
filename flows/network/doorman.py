"""The doorman: the network root's own side (create the root, issue node certificates).

The operator creates the root once (:meth:`RootAuthority.create`) and keeps its directory
offline. Each node sends a certificate request made from its identity key
(:func:`certificate_request`); the operator checks it and issues the node a certificate
directly from the root, with no intermediate (:meth:`RootAuthority.issue`). Nodes check
certificates with :class:`~flows.network.trust.NetworkRoot`.

The operator also certifies the brokers that hold nodes' inbounds
(:meth:`RootAuthority.issue_tls_server`, :func:`new_tls_server_key`): a bridge connecting to a
peer's ``amqps://`` inbound verifies the broker's certificate against the same root.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from flows.network.identity import NodeIdentity
from flows.network.trust import (
    NetworkRoot,
    NetworkTrustError,
    load_certificate,
    party_name,
    x509_name,
)

__all__ = [
    "DEFAULT_NODE_DAYS",
    "DEFAULT_ROOT_DAYS",
    "DEFAULT_ROOT_SUBJECT",
    "DEFAULT_TLS_DAYS",
    "ROOT_CERTIFICATE_FILE",
    "ROOT_KEY_FILE",
    "RootAuthority",
    "certificate_request",
    "new_tls_server_key",
    "tls_host_names",
    "write_new_file",
]

ROOT_KEY_FILE = "network-root.key.pem"
"""The root's private key in the root directory (PKCS#8 PEM, mode 0600)."""
ROOT_CERTIFICATE_FILE = "network-root.cert.pem"
"""The root's self-signed certificate in the root directory (give it to every node)."""
DEFAULT_ROOT_SUBJECT = "CN=Fiberflow Network Root,O=Example Network"
"""The root certificate's subject unless another is given."""
DEFAULT_ROOT_DAYS = 3650
"""How long a root certificate is valid unless told otherwise."""
DEFAULT_NODE_DAYS = 365
"""How long a node certificate is valid unless told otherwise."""
DEFAULT_TLS_DAYS = 365
"""How long a broker's TLS server certificate is valid unless told otherwise."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(text: str, what: str) -> x509.Name:
    try:
        return x509.Name.from_rfc4514_string(text)
    except ValueError as error:
        raise NetworkTrustError(f"{what} {text!r} is not an X.500 name: {error}") from None


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def write_new_file(path: Path, data: bytes, mode: int, what: str = "a key") -> None:
    """Write a file that must not exist yet, created with ``mode`` (keys: 0o600)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise NetworkTrustError(f"{path} exists: refusing to overwrite {what}") from None
    with os.fdopen(descriptor, "wb") as output:
        output.write(data)


@attrs.frozen
class RootAuthority:
    """The network root's private key and certificate: what issues node certificates.

    Keep its directory offline; nodes only ever need the certificate (:class:`NetworkRoot`).
    """

    key: Ed25519PrivateKey
    certificate: x509.Certificate

    @classmethod
    def create(
        cls,
        directory: str | Path,
        subject: str = DEFAULT_ROOT_SUBJECT,
        days: int = DEFAULT_ROOT_DAYS,
    ) -> RootAuthority:
        """A new root: writes :data:`ROOT_KEY_FILE` (0600) and :data:`ROOT_CERTIFICATE_FILE`.

        Refuses (:class:`NetworkTrustError`) if either file exists already.
        """
        if days < 1:
            raise NetworkTrustError(f"a root must be valid for at least 1 day, not {days}")
        directory = Path(directory)
        name = _name(subject, "root subject")
        for file in (ROOT_KEY_FILE, ROOT_CERTIFICATE_FILE):
            if (directory / file).exists():
                raise NetworkTrustError(
                    f"{directory / file} exists: refusing to overwrite a network root"
                )
        key = Ed25519PrivateKey.generate()
        now = _now()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, None)
        )
        directory.mkdir(parents=True, exist_ok=True)
        write_new_file(
            directory / ROOT_KEY_FILE,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
            0o600,
            "a network root",
        )
        write_new_file(
            directory / ROOT_CERTIFICATE_FILE,
            certificate.public_bytes(serialization.Encoding.PEM),
            0o644,
            "a network root",
        )
        return cls(key, certificate)

    @classmethod
    def load(cls, directory: str | Path) -> RootAuthority:
        """The root in ``directory`` (written by :meth:`create`)."""
        directory = Path(directory)
        key_path = directory / ROOT_KEY_FILE
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except OSError as error:
            raise NetworkTrustError(
                f"root key {key_path}: cannot read it: {error.strerror}"
            ) from None
        except (ValueError, TypeError) as error:
            raise NetworkTrustError(
                f"root key {key_path}: not a PEM private key: {error}"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise NetworkTrustError(f"root key {key_path}: not an Ed25519 key")
        cert_path = directory / ROOT_CERTIFICATE_FILE
        certificate = load_certificate(cert_path, "root certificate")
        if _raw(key.public_key()) != _raw(NetworkRoot(certificate).public_key):
            raise NetworkTrustError(f"root key {key_path} does not belong to {cert_path}")
        return cls(key, certificate)

    def network_root(self) -> NetworkRoot:
        """The root as nodes see it (its certificate only)."""
        return NetworkRoot(self.certificate)

    def issue(
        self,
        request_pem: bytes,
        days: int = DEFAULT_NODE_DAYS,
        *,
        not_before: datetime.datetime | None = None,
    ) -> x509.Certificate:
        """A node certificate for a checked certificate request (the doorman step).

        The request must carry a valid signature, a valid party name as its subject and an
        Ed25519 key. The certificate is valid for ``days`` from ``not_before`` (default: now;
        tests give a past one for an expired certificate).
        """
        try:
            request = x509.load_pem_x509_csr(request_pem)
        except ValueError as error:
            raise NetworkTrustError(f"not a PEM certificate request: {error}") from None
        if not request.is_signature_valid:
            raise NetworkTrustError("the certificate request's signature does not verify")
        try:
            subject = party_name(request.subject)
        except ValueError as error:
            raise NetworkTrustError(f"the request's subject is not a node name: {error}") from None
        public_key = request.public_key()
        if not isinstance(public_key, Ed25519PublicKey):
            raise NetworkTrustError(
                f"the request for {subject} holds a {type(public_key).__name__}, not an Ed25519 key"
            )
        start, end = self._validity(days, not_before)
        return (
            x509.CertificateBuilder()
            .subject_name(request.subject)
            .issuer_name(self.certificate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(digital_signature=True), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
            .sign(self.key, None)
        )

    def issue_tls_server(
        self,
        public_key: Ed25519PublicKey | EllipticCurvePublicKey,
        hosts: Sequence[str],
        days: int = DEFAULT_TLS_DAYS,
        *,
        not_before: datetime.datetime | None = None,
    ) -> x509.Certificate:
        """A TLS server certificate for a broker reachable as ``hosts`` (names or IP addresses).

        The subject is ``CN=<first host>``; every host is a subjectAltName (an IP address as
        such, anything else as a DNS name), which is what clients check the host they
        connected to against. The certificate is for server authentication only, is not a
        CA, and is signed by the root directly. ``public_key`` is the broker's (Ed25519, as
        :func:`new_tls_server_key` makes, or ECDSA).
        """
        names = tls_host_names(hosts)
        if not isinstance(public_key, Ed25519PublicKey | EllipticCurvePublicKey):
            raise NetworkTrustError(
                f"a TLS server key must be Ed25519 or ECDSA, not {type(public_key).__name__}"
            )
        start, end = self._validity(days, not_before)
        return (
            x509.CertificateBuilder()
            .subject_name(_host_subject(hosts[0]))
            .issuer_name(self.certificate.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(digital_signature=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
            .sign(self.key, None)
        )

    def _validity(
        self, days: int, not_before: datetime.datetime | None
    ) -> tuple[datetime.datetime, datetime.datetime]:
        """The start and end of a certificate valid ``days``, refused if it outlives the root."""
        if days < 1:
            raise NetworkTrustError(f"a certificate must be valid for at least 1 day, not {days}")
        start = _now() - datetime.timedelta(minutes=5) if not_before is None else not_before
        end = start + datetime.timedelta(days=days)
        if end > self.certificate.not_valid_after_utc:
            raise NetworkTrustError(
                f"a certificate valid until {end:%Y-%m-%d} would outlive the root (valid until "
                f"{self.certificate.not_valid_after_utc:%Y-%m-%d}); issue it for fewer days"
            )
        return start, end


def tls_host_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """The subjectAltNames for ``hosts``: IP addresses as such, others as DNS names.

    Refuses (:class:`NetworkTrustError`) no host at all, and a host that is neither an IP
    address nor a DNS name (letters, digits, hyphens and dots; a leading ``*.`` wildcard).
    """
    if not hosts:
        raise NetworkTrustError("a TLS server certificate needs at least one host")
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
            continue
        except ValueError:
            pass
        labels = host.removeprefix("*.").split(".")
        if len(host) > 253 or not all(
            0 < len(label) < 64 and label.replace("-", "").isalnum() and label.isascii()
            for label in labels
        ):
            raise NetworkTrustError(f"{host!r} is neither an IP address nor a DNS name")
        names.append(x509.DNSName(host.lower()))
    return names


def _host_subject(host: str) -> x509.Name:
    """``CN=<host>`` (an empty subject for a host longer than a common name may be)."""
    if len(host) > 64:
        return x509.Name([])
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])


def new_tls_server_key() -> Ed25519PrivateKey:
    """A new key for a broker's TLS listener (Ed25519: needs TLS 1.3, see docs/security.md)."""
    return Ed25519PrivateKey.generate()


def _key_usage(*, cert_sign: bool = False, digital_signature: bool = False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def certificate_request(identity: NodeIdentity) -> bytes:
    """A PEM certificate request for ``identity``'s name and key, signed with its key."""
    try:
        name = x509_name(identity.name)
    except ValueError as error:
        raise NetworkTrustError(str(error)) from None
    request = (
        x509.CertificateSigningRequestBuilder().subject_name(name).sign(identity.private_key, None)
    )
    return request.public_bytes(serialization.Encoding.PEM)
