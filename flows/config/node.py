"""What a node needs to start (:class:`NodeConfig`), checked when it is made."""

from __future__ import annotations

import attrs

from flows.party import Party
from foundation.serialization import DEFAULT_LIMITS, SerializationLimits
from messaging.codec import wire_limits_problem
from persistence.lease import DEFAULT_LEASE_SECONDS

DEFAULT_RECEIVE_TIMEOUT = 3600.0
"""A receive waits at most an hour unless the flow or the node config says otherwise."""

DEFAULT_HIBERNATE_AFTER = 60.0
"""A node process's flows give up their memory after waiting this long (seconds)."""


@attrs.frozen
class NodeConfig:
    """What a node needs to start: its name, database and CorDapps."""

    name: str
    database_url: str
    cordapps: tuple[str, ...] = ()
    synchronous: str = "FULL"
    database_schema: str | None = None
    receive_timeout: float | None = DEFAULT_RECEIVE_TIMEOUT
    """Seconds a receive waits when the flow gives no timeout (None: forever)."""
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    """How long the node's lease on its database lasts without renewal (see
    :mod:`persistence.lease`)."""
    limits: SerializationLimits = DEFAULT_LIMITS
    """What payloads and session messages may be (size, depth, lengths), both ways."""
    operation_threads: int = 16
    """Threads running flows' external operations at once (``FlowLogic.call_external``)."""
    hibernate_after: float | None = DEFAULT_HIBERNATE_AFTER
    """Seconds a flow waits (on a receive or a sleep) before it gives up its memory and
    keeps only its id; a message, its timer or an operator wakes it (None: never; 0: as soon
    as it suspends). See :mod:`statemachine.hibernation`."""
    memory_budget_mb: int | None = None
    """While the process's resident memory is above this many MiB, every waiting flow
    hibernates, however briefly it has waited (None: no budget)."""

    def __attrs_post_init__(self) -> None:
        if (
            not isinstance(self.operation_threads, int)
            or isinstance(self.operation_threads, bool)
            or self.operation_threads < 1
        ):
            raise ValueError(
                f"node {self.name}: operation_threads must be a whole number of at least 1, "
                f"not {self.operation_threads!r}"
            )
        for name in ("hibernate_after", "memory_budget_mb"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < 0
            ):
                raise ValueError(
                    f"node {self.name}: {name} must be a number of at least 0 or None, "
                    f"not {value!r}"
                )
        if not self.lease_seconds > 0:
            raise ValueError(
                f"node {self.name}: lease_seconds must be positive, not {self.lease_seconds!r}"
            )
        if self.receive_timeout is not None and not self.receive_timeout > 0:
            raise ValueError(
                f"node {self.name}: receive_timeout must be positive seconds or None, "
                f"not {self.receive_timeout!r}"
            )
        Party(self.name)  # validates the name, naming the problem
        problem = wire_limits_problem(self.limits)
        if problem is not None:
            raise ValueError(f"node {self.name}: {problem}")
        if not self.database_url or "://" not in self.database_url:
            raise ValueError(
                f"node {self.name}: database_url {self.database_url!r} is not a URL "
                "(for example sqlite:///alice.db)"
            )
