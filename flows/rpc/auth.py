"""Who a request comes from: HTTP Basic (user and password) or a bearer API token.

Every check is an argon2 verification (about 50 ms and 64 MiB, by design), also for an
unknown user name, which is checked against a fixed hash so that it costs the same and an
answer's time does not tell which user names exist. A successful check is remembered for
:data:`CACHE_SECONDS` (by a SHA-256 of the credentials, never the credentials themselves),
so a client making many requests pays the hash once a minute, not per request. A failed one
is never cached. At most :data:`CONCURRENT_VERIFICATIONS` run at once. Secrets are never logged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import time
from collections.abc import Callable

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from flows.config.rpc import RpcUser
from flows.rpc.hashing import MAX_SECRET_CHARS

CACHE_SECONDS = 60.0
"""How long a successful verification is remembered."""
CACHE_ENTRIES = 4096
"""At most this many remembered verifications (the oldest go first)."""
CONCURRENT_VERIFICATIONS = 4
"""At most this many argon2 verifications at once (each takes 64 MiB): a flood of wrong
passwords queues up instead of taking the node's memory."""

_HASHER = PasswordHasher()
_DUMMY_HASH = _HASHER.hash("no user has this password")
_VERIFYING = threading.BoundedSemaphore(CONCURRENT_VERIFICATIONS)


class AuthenticationError(Exception):
    """The request's credentials are missing, malformed or wrong (HTTP 401)."""


class Authenticator:
    """Checks requests' ``Authorization`` headers against the configured users."""

    def __init__(
        self, users: tuple[RpcUser, ...], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._passwords = {u.name: u for u in users if u.password_hash is not None}
        self._tokens = [u for u in users if u.token_hash is not None]
        self._clock = clock
        self._verified: dict[bytes, tuple[RpcUser, float]] = {}
        self._lock = threading.Lock()

    def user_for(self, authorization: str | None) -> RpcUser:
        """The user an ``Authorization`` header proves; AuthenticationError if none."""
        if not authorization:
            raise AuthenticationError("credentials needed: HTTP Basic or a bearer token")
        scheme, _, value = authorization.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "basic":
            name, password = _basic(value)
            return self._check(b"basic", name, password, self._password_user)
        if scheme.lower() == "bearer":
            if not value or len(value) > MAX_SECRET_CHARS:
                raise AuthenticationError("malformed bearer token")
            return self._check(b"bearer", "", value, self._token_user)
        raise AuthenticationError(f"unsupported authorization scheme {scheme[:20]!r}")

    def password_user(self, name: str, password: str) -> RpcUser:
        """The user a name and password prove (the web console's login form).

        Only password users can log in this way; AuthenticationError otherwise, with the
        same message whether the name is unknown, a token user's, or the password wrong.
        """
        if not name or len(name) > MAX_SECRET_CHARS or len(password) > MAX_SECRET_CHARS:
            raise AuthenticationError("wrong user name or password")
        try:
            return self._check(b"basic", name, password, self._password_user)
        except AuthenticationError:
            raise AuthenticationError("wrong user name or password") from None

    def _check(
        self, kind: bytes, name: str, secret: str, verify: Callable[[str, str], RpcUser | None]
    ) -> RpcUser:
        key = hashlib.sha256(b"\0".join((kind, name.encode(), secret.encode()))).digest()
        now = self._clock()
        with self._lock:
            cached = self._verified.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        user = verify(name, secret)
        if user is None:
            raise AuthenticationError("wrong user name, password or token")
        with self._lock:
            if len(self._verified) >= CACHE_ENTRIES:
                for stale in list(self._verified)[: CACHE_ENTRIES // 4]:
                    del self._verified[stale]
            self._verified[key] = (user, now + CACHE_SECONDS)
        return user

    def _password_user(self, name: str, password: str) -> RpcUser | None:
        user = self._passwords.get(name)
        encoded = user.password_hash if user is not None else None
        ok = _verifies(encoded or _DUMMY_HASH, password)
        return user if ok and user is not None else None

    def _token_user(self, _: str, token: str) -> RpcUser | None:
        if not self._tokens:
            _verifies(_DUMMY_HASH, token)
            return None
        for user in self._tokens:
            assert user.token_hash is not None
            if _verifies(user.token_hash, token):
                return user
        return None


def _verifies(encoded: str, secret: str) -> bool:
    with _VERIFYING:
        try:
            return _HASHER.verify(encoded, secret)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False


def _basic(value: str) -> tuple[str, str]:
    """The user name and password of an HTTP Basic credential."""
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise AuthenticationError("malformed Basic credentials") from None
    name, colon, password = decoded.partition(":")
    if not colon or not name or len(password) > MAX_SECRET_CHARS:
        raise AuthenticationError("malformed Basic credentials")
    return name, password
