"""The thread that keeps a node process's lease: renewing it, and rebalancing a worker's share."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from persistence.lease import RETRY_RENEWAL_SECONDS, LeaseLostError, NodeLease, Rebalance

log = logging.getLogger("fiberflow.lease")


class LeaseKeeper:
    """Renews a lease on a thread of its own; calls ``on_lost`` once if the lease is lost.

    For a worker of a shared node each renewal is a :meth:`NodeLease.rebalance`; a change is
    passed to ``on_rebalance`` (which stops running the partitions to release and then
    releases them). Without ``on_rebalance`` the partitions to release are released at once.
    Errors other than losing the lease (the database is unreachable for a moment) are logged
    and retried at the next tick; the lease's own expiry decides whether it survives them.
    """

    def __init__(
        self,
        lease: NodeLease,
        on_lost: Callable[[LeaseLostError], None],
        name: str,
        on_rebalance: Callable[[Rebalance], None] | None = None,
    ) -> None:
        self._lease = lease
        self._on_lost = on_lost
        self._on_rebalance = on_rebalance
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{name}", daemon=True)

    def start(self) -> None:
        """Start renewing."""
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the lease itself is released by its owner)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _tick(self) -> None:
        lease = self._lease
        if not lease.shared:
            lease.renew()
            return
        change = lease.rebalance()
        if not (change.taken or change.to_release):
            return
        if self._on_rebalance is not None:
            self._on_rebalance(change)
        else:
            lease.release_partitions(change.to_release)

    def _run(self) -> None:
        regular = self._lease.renewal_interval
        interval = regular
        while not self._stop.wait(interval):
            interval = regular
            try:
                self._tick()
            except LeaseLostError as error:
                self._on_lost(error)
                return
            except (DBAPIError, OSError) as error:
                interval = min(RETRY_RENEWAL_SECONDS, regular)  # try again soon
                log.warning("cannot renew the node lease yet: %s", error)
            except Exception:  # a bug here must not end renewal silently
                log.exception("renewing the node lease failed")


__all__ = ["LeaseKeeper"]
