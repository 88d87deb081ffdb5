"""Who a node process is, and whether a process on this host is gone (Linux ``/proc``).

A worker of a node (:mod:`persistence.lease`) records these facts in its lease row, so that
a process starting on the same host can tell a dead holder (SIGKILLed, or ended and not
reaped yet) from a live one at once, without waiting for its lease to expire.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import attrs


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux), or None if unknown."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 overall: starttime
    except (IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """Process ``pid``'s state letter (``R``, ``S``, ``T``, ``Z`` ...; Linux), or None."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


@attrs.frozen
class WorkerInfo:
    """Who a worker is: enough to name it and to tell whether its process is still alive."""

    worker_id: str
    pid: int
    host: str
    boot_id: str
    process_start: int
    pid_namespace: int = 0
    """The inode of the process's PID namespace (0: unknown). Process ids of two
    containers on one host are comparable only within one namespace."""
    name: str = ""
    """The worker's name given by the operator (``--worker NAME``); empty for a node run as
    one process."""

    @classmethod
    def of_this_process(cls, worker_id: str | None = None, name: str = "") -> WorkerInfo:
        """Describe the calling process, under a fresh worker id (or ``worker_id``)."""
        pid = os.getpid()
        return cls(
            worker_id=worker_id or uuid.uuid4().hex,
            pid=pid,
            host=socket.gethostname()[:255],
            boot_id=_read_text("/proc/sys/kernel/random/boot_id") or "",
            process_start=process_start_ticks(pid) or 0,
            pid_namespace=_pid_namespace(),
            name=name,
        )

    def describe(self) -> str:
        """``pid 123 on host h (worker 3f2a9c1e)``, with the worker's name if it has one."""
        named = f"{self.name!r}, " if self.name else ""
        return f"pid {self.pid} on host {self.host} (worker {named}{self.worker_id[:8]})"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def process_is_gone(worker: WorkerInfo) -> bool:
    """True only if ``worker``'s process, on this host, no longer exists.

    Same host, same boot and same PID namespace are required to judge it: a worker in
    another PID namespace (another container) is never judged by its process id. A process
    id reused by another program counts as gone (its start time differs), and so does a
    process that ended but was not reaped yet by its parent (a zombie).
    """
    here = WorkerInfo.of_this_process("")
    if worker.host != here.host or not worker.boot_id or worker.boot_id != here.boot_id:
        return False
    if not worker.pid_namespace or worker.pid_namespace != here.pid_namespace:
        return False
    try:
        os.kill(worker.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, owned by another user
    if process_state(worker.pid) in ("Z", "X"):
        return True  # it ended; its parent has not reaped it yet (a zombie)
    started = process_start_ticks(worker.pid)
    return started is not None and worker.process_start != 0 and started != worker.process_start


__all__ = ["WorkerInfo", "process_is_gone", "process_start_ticks", "process_state"]
