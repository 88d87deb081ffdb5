"""TLS for a node's broker connections: what the node trusts, and what it presents.

A connection to an ``amqps://`` address (a peer's inbound through a bridge, or the node's own
inbound) is made with an :class:`ssl.SSLContext` from a :data:`TlsContextFactory`. A node's
:class:`TlsSettings` build it:

* with ``trust`` (the network root's certificate) the broker's certificate must chain to that
  root, and to nothing else: the system's trust store is not used;
* without it, the system's trust store decides (as for any TLS client);
* either way the host name of the URL must match the certificate (``check_hostname``);
* with ``certificate`` and ``key_file`` (the node's certificate from the root and its Ed25519
  identity key) the node presents them as its client certificate when the broker asks for one.

The factory is called for each new connection, so renewed files are read at the next
connection, not only at the next start.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs

__all__ = ["TlsContextFactory", "TlsSettings", "TlsSetupError", "certificate_refusal"]

TlsContextFactory = Callable[[], ssl.SSLContext]
"""Makes the client context of one new TLS connection."""


class TlsSetupError(ValueError):
    """The node's TLS files cannot be used; the message names the file and the problem."""


@attrs.frozen
class TlsSettings:
    """What a node's TLS connections trust and present (see the module docstring)."""

    trust: Path | None = None
    """The CA certificate (PEM) brokers' certificates must chain to (None: the system's)."""
    certificate: Path | None = None
    """The node's certificate (PEM), presented when a broker asks for a client certificate."""
    key_file: Path | None = None
    """The private key (PEM) of ``certificate``: the node's identity key."""

    def context(self) -> ssl.SSLContext:
        """A new client context: verifies the broker and its host name, presents the node.

        Raises :class:`TlsSetupError` naming the file that cannot be used.
        """
        try:
            context = ssl.create_default_context(
                cafile=None if self.trust is None else str(self.trust)
            )
        except (OSError, ValueError) as error:
            raise TlsSetupError(
                f"TLS trust {self.trust}: cannot use it as CA certificates: {_reason(error)}"
            ) from None
        if self.certificate is not None and self.key_file is not None:
            try:
                context.load_cert_chain(str(self.certificate), str(self.key_file))
            except (OSError, ValueError) as error:
                raise TlsSetupError(
                    f"TLS client certificate {self.certificate} with key {self.key_file}: "
                    f"cannot use them: {_reason(error)}"
                ) from None
        return context

    def libpq_url(self, url: str) -> str:
        """``url`` with this node's TLS files, when it is a PostgreSQL URL that verifies.

        A PostgreSQL inbound published with ``sslmode=verify-full`` (or ``verify-ca``) is
        reached over TLS by libpq, which reads its trust and client certificate from files:
        this adds ``sslrootcert`` (the network root: the server's certificate must chain to
        it) and ``sslcert``/``sslkey`` (presented if the server asks) unless the URL names
        its own. Any other URL is returned unchanged.
        """
        parts = urlsplit(url)
        if not parts.scheme.startswith("postgres"):
            return url
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if query.get("sslmode") not in ("verify-ca", "verify-full"):
            return url
        if self.trust is not None:
            query.setdefault("sslrootcert", str(self.trust))
        if self.certificate is not None and self.key_file is not None:
            query.setdefault("sslcert", str(self.certificate))
            query.setdefault("sslkey", str(self.key_file))
        return urlunsplit(parts._replace(query=urlencode(query)))

    def describe(self) -> str:
        """One line for logs: what is trusted and whether a client certificate is presented."""
        trust = "the system's trust store" if self.trust is None else f"the root {self.trust}"
        presents = self.certificate is not None and self.key_file is not None
        client = f", presenting {self.certificate}" if presents else ", no client certificate"
        return f"TLS trusts {trust}{client}"


def _reason(error: BaseException) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or str(error)
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)


def certificate_refusal(error: BaseException) -> str | None:
    """What a connection error says about a refused certificate (either side's), or None.

    pika wraps the :class:`ssl.SSLError` of a failed handshake in its own exceptions (in
    their ``args`` and causes, or only as text when the broker refused this side's
    certificate after the handshake); this digs it out so that the caller can name what was
    refused instead of "cannot connect", and give up at once: trying again would not help.
    Other TLS errors (a connection cut during the handshake) are not refusals: None.
    """
    seen: set[int] = set()
    pending: list[object] = [error]
    texts: list[str] = []
    while pending:
        current = pending.pop()
        if isinstance(current, str):
            texts.append(current)
        if id(current) in seen or not isinstance(current, BaseException):
            continue
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return f"the broker's certificate failed verification: {current.verify_message}"
        if isinstance(current, ssl.SSLError):
            reason = getattr(current, "reason", None)  # set by the ssl module's own errors
            texts.append(f"[SSL: {reason}] {current}" if reason else str(current))
        pending.extend([*current.args, current.__cause__, current.__context__])
    for text in texts:
        for code, words in _SSL_TEXT.findall(text):
            if any(code.endswith(refusal) for refusal in _CLIENT_REFUSED):
                return f"the broker refused this node's TLS client certificate: {words.strip()}"
    return None


_SSL_TEXT = re.compile(r"\[SSL: ([A-Z0-9_]+)\] ([^(\]]*)")
_CLIENT_REFUSED = ("CERTIFICATE_REQUIRED", "UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_EXPIRED")
"""The TLS alerts a broker sends when it does not accept this side's client certificate."""
