"""What the flow decorators write on a class, and how everyone else reads it.

:mod:`flows.decorators` checks a class and then marks it here; ``FlowLogic`` (its initiator
when it opens sessions) and the CorDapp registry (responders, RPC permission) read the marks
here. The marks belong to exactly the class decorated: a subclass does not inherit them.
"""

from __future__ import annotations

import attrs

__all__ = [
    "InitiatingInfo",
    "app_name_of",
    "initiating_info",
    "is_startable_by_rpc",
    "mark_initiating",
    "mark_responder",
    "mark_startable_by_rpc",
    "responder_initiator",
]


@attrs.frozen
class InitiatingInfo:
    """What an ``@initiating_flow`` tells the peer: its class name, version and app."""

    flow_class: str
    version: int
    app_name: str


def app_name_of(cls: type) -> str:
    """The CorDapp (top-level package) a class belongs to."""
    return cls.__module__.split(".")[0]


def mark_initiating(cls: type, info: InitiatingInfo) -> None:
    """Mark ``cls`` as an initiating flow (``@initiating_flow``)."""
    cls._ff_initiating = info  # type: ignore[attr-defined]


def initiating_info(cls: type) -> InitiatingInfo | None:
    """The ``@initiating_flow`` marking of exactly this class (not inherited), or None."""
    info = cls.__dict__.get("_ff_initiating")
    return info if isinstance(info, InitiatingInfo) else None


def mark_responder(cls: type, initiator: type) -> None:
    """Mark ``cls`` as the responder to ``initiator`` (``@initiated_by``)."""
    cls._ff_initiated_by = initiator  # type: ignore[attr-defined]


def responder_initiator(cls: type) -> type | None:
    """The initiating flow class this responder answers (not inherited), or None."""
    initiator = cls.__dict__.get("_ff_initiated_by")
    return initiator if isinstance(initiator, type) else None


def mark_startable_by_rpc(cls: type) -> None:
    """Mark ``cls`` as startable from outside the node (``@startable_by_rpc``)."""
    cls._ff_startable_by_rpc = True  # type: ignore[attr-defined]


def is_startable_by_rpc(cls: type) -> bool:
    """True if ``cls`` itself is marked ``@startable_by_rpc``."""
    return bool(cls.__dict__.get("_ff_startable_by_rpc", False))
