"""A PostgreSQL server of its own with a TLS listener, for the transport-security tests.

The machine's PostgreSQL (127.0.0.1:5432) has no TLS listener, and other tests use it, so
:func:`tls_postgres` starts a second server: ``initdb`` into a fresh directory owned by the
``postgres`` user, the certificate and key it is given as its server certificate, ``ssl =
on``, listening on a free port of 127.0.0.1 only, trust authentication; and stops it
(``pg_ctl stop -m immediate``) and removes the directory at the end. PostgreSQL refuses to
run as root, so the server runs as ``postgres`` (through ``runuser`` as root, ``sudo -n -u
postgres`` otherwise).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["tls_postgres", "tls_postgres_problem"]


def _binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _as_postgres() -> list[str]:
    return (
        ["runuser", "-u", "postgres", "--"]
        if os.geteuid() == 0
        else ["sudo", "-n", "-u", "postgres"]
    )


def tls_postgres_problem() -> str | None:
    """Why a PostgreSQL server of our own cannot be started here, or None if it can."""
    if _binaries() is None:
        return "PostgreSQL's server programs (initdb, pg_ctl) are not installed"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "there is no postgres user to run a PostgreSQL server as"
    if os.geteuid() != 0:
        probe = subprocess.run(["sudo", "-n", "-u", "postgres", "true"], capture_output=True)
        if probe.returncode != 0:
            return "cannot run commands as the postgres user (not root, no password-less sudo)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def tls_postgres(certificate_pem: bytes, key_pem: bytes) -> Iterator[int]:
    """Run a TLS PostgreSQL server with this certificate and key; yields its port."""
    binaries = _binaries()
    assert binaries is not None, tls_postgres_problem()
    postgres = pwd.getpwnam("postgres")
    directory = Path(tempfile.mkdtemp(prefix="fiberflow-tls-pg-"))
    data = directory / "data"
    port = _free_port()
    os.chown(directory, postgres.pw_uid, postgres.pw_gid)

    def run(*command: str) -> None:
        done = subprocess.run(
            [*_as_postgres(), *command], capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}")

    started = False
    try:
        run(
            str(binaries / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"
        )
        for name, content in (("server.crt", certificate_pem), ("server.key", key_pem)):
            path = data / name
            path.write_bytes(content)
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
            path.chmod(0o600)
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nport = {port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{directory}'\nssl = on\n"
                "ssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
                "fsync = off\n"
            )
        run(
            str(binaries / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-t",
            "60",
            "-l",
            str(directory / "server.log"),
            "start",
        )
        started = True
        yield port
    finally:
        if started:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(directory, ignore_errors=True)
