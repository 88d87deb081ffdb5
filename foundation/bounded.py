"""Bounded copies of untrusted text, for dead-letter records that must always be writable.

A dead letter keeps evidence of a message that was refused, and writing it must never fail
because of what the message contained: a field longer than its column, a NUL character
(PostgreSQL refuses those in text), a lone surrogate (not encodable as UTF-8). Such a value is
stored as a cleaned prefix followed by ``...#`` and the first 16 hex digits of the SHA-256 of
the whole value, so distinct values stay distinct and the record fits its column. A value that
is already fine is stored unchanged.
"""

from __future__ import annotations

import hashlib

from statemachine.limits import DEAD_LETTER_REASON_CHARS

DIGEST_MARK = "...#"
"""Separates a cut value's kept prefix from its digest."""
DIGEST_HEX = 16
"""Hex digits of the SHA-256 of the whole value appended to a cut one."""
_SUFFIX_CHARS = len(DIGEST_MARK) + DIGEST_HEX


def _storable(value: str) -> bool:
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def digest(value: str) -> str:
    """The first ``DIGEST_HEX`` hex digits of the SHA-256 of ``value`` (any str)."""
    whole = value.encode("utf-8", "surrogatepass")
    return hashlib.sha256(whole).hexdigest()[:DIGEST_HEX]


def bounded_text(value: object, limit: int) -> str:
    """``value`` as text that fits ``limit`` characters and any database text column.

    Unchanged if it already does; else its start, cleaned (NUL and unencodable characters
    replaced), then ``...#`` and its digest. ``limit`` must leave room for the digest.
    """
    if limit <= _SUFFIX_CHARS:
        raise ValueError(f"a limit of {limit} leaves no room for the digest")
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit and _storable(text):
        return text
    cleaned = text[: limit - _SUFFIX_CHARS].replace("\x00", "\ufffd")
    cleaned = cleaned.encode("utf-8", "replace").decode("utf-8")
    return f"{cleaned}{DIGEST_MARK}{digest(text)}"


def bounded_reason(reason: object) -> str:
    """A dead letter's reason, within ``limits.DEAD_LETTER_REASON_CHARS`` (see bounded_text)."""
    return bounded_text(reason, DEAD_LETTER_REASON_CHARS)
