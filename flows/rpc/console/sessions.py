"""Console logins: a server-side session table in the node process's memory.

A login gets a random session id (the cookie's only content, 256 bits) and a random CSRF
token that every state-changing form carries. Nothing is signed because nothing is kept on
the client: the table lives as long as the process, so a restart logs everyone out, and
logging out removes the session at once.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Callable

import attrs

from flows.config.rpc import RpcUser

SESSION_COOKIE = "fiberflow_console"
"""The cookie holding the session id (HttpOnly, SameSite=Strict, Secure under TLS)."""
LOGIN_COOKIE = "fiberflow_console_login"
"""The cookie holding the login form's CSRF token (HttpOnly, SameSite=Strict, Secure under
TLS): the form must post the same token, which a page of another site can neither read nor
make the browser send, so it cannot log a victim in as the attacker (login CSRF)."""
SESSION_SECONDS = 8 * 3600
"""A session ends this long after its login."""
MAX_SESSIONS = 1000
"""At most this many sessions at once (the oldest ends first)."""


@attrs.frozen
class Session:
    """One logged-in user."""

    session_id: str
    user: RpcUser
    csrf_token: str
    expires: float
    """When it ends, on the store's clock."""

    def csrf_ok(self, token: str | None) -> bool:
        """True if ``token`` is this session's CSRF token (compared in constant time)."""
        return token is not None and hmac.compare_digest(token, self.csrf_token)


def login_token() -> str:
    """A fresh random token for the login form and its cookie (256 bits)."""
    return secrets.token_urlsafe(32)


def login_token_ok(cookie: str | None, posted: str | None) -> bool:
    """True if the login form posted the token its cookie holds (constant-time compare)."""
    return bool(cookie) and bool(posted) and hmac.compare_digest(str(cookie), str(posted))


class SessionStore:
    """The sessions of one process, and the one-shot messages shown on their next page."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._notes: dict[str, str] = {}
        self._lock = threading.Lock()

    def create(self, user: RpcUser) -> Session:
        """A new session for ``user``."""
        session = Session(
            secrets.token_urlsafe(32),
            user,
            secrets.token_urlsafe(32),
            self._clock() + SESSION_SECONDS,
        )
        with self._lock:
            while len(self._sessions) >= MAX_SESSIONS:
                oldest = min(self._sessions.values(), key=lambda s: s.expires)
                self._end(oldest.session_id)
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id, or None (unknown, ended or expired)."""
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires <= self._clock():
                self._end(session_id)
                return None
        return session

    def end(self, session_id: str) -> None:
        """Log the session out (nothing if it is not there)."""
        with self._lock:
            self._end(session_id)

    def note(self, session_id: str, message: str) -> None:
        """Show ``message`` on the session's next page."""
        with self._lock:
            if session_id in self._sessions:
                self._notes[session_id] = message

    def take_note(self, session_id: str) -> str | None:
        """The message waiting for the session's page, once."""
        with self._lock:
            return self._notes.pop(session_id, None)

    def _end(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._notes.pop(session_id, None)
