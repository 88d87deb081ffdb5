"""argon2 hashes of the API's passwords and tokens, and ``fiberflow rpc`` that makes them.

The config stores only hashes (argon2id, argon2-cffi's default parameters): whoever reads
the config cannot log in. ``fiberflow rpc hash-password`` reads a password (from stdin when
it is not a terminal, else a prompt asked twice) and prints its hash; ``fiberflow rpc
new-token`` prints a new random API token and its hash (the token is shown once: keep it).
"""

from __future__ import annotations

import getpass
import secrets
import sys
from typing import TextIO

from argon2 import PasswordHasher

TOKEN_PREFIX = "fft_"
"""How every API token begins (so that a leaked one is easy to recognise and search for)."""
TOKEN_BYTES = 32
"""Random bytes in a token (256 bits)."""
MAX_SECRET_CHARS = 1024
"""The longest password or token accepted (argon2 would hash more, slowly, for nothing)."""

_HASHER = PasswordHasher()


def hash_secret(secret: str) -> str:
    """The argon2id hash of a password or token, as the config stores it."""
    return _HASHER.hash(secret)


def new_token() -> str:
    """A new random API token (``fft_`` and 43 URL-safe characters)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def read_password(stdin: TextIO) -> str:
    """The password to hash: stdin's first line, or (on a terminal) a prompt asked twice.

    Raises ValueError naming the problem (empty, too long, the two entries differ).
    """
    if stdin.isatty():
        first = getpass.getpass("password: ")
        if getpass.getpass("again: ") != first:
            raise ValueError("the two passwords differ")
        password = first
    else:
        password = stdin.readline().rstrip("\r\n")
    if not password:
        raise ValueError("the password is empty")
    if len(password) > MAX_SECRET_CHARS:
        raise ValueError(f"the password is longer than {MAX_SECRET_CHARS} characters")
    return password


def run_rpc_command(command: str) -> int:
    """``fiberflow rpc hash-password|new-token``; returns the exit status."""
    if command == "new-token":
        token = new_token()
        print(f"token = {token}")
        print(f'token_hash = "{hash_secret(token)}"')
        print("# the token is shown only now: give it to its user; the config keeps the hash")
        return 0
    try:
        password = read_password(sys.stdin)
    except ValueError as error:
        print(f"fiberflow rpc hash-password: {error}", file=sys.stderr)
        return 2
    except (EOFError, KeyboardInterrupt):
        print("fiberflow rpc hash-password: no password given", file=sys.stderr)
        return 2
    print(hash_secret(password))
    return 0
