"""``@initiating_flow``, ``@initiated_by``, ``@startable_by_rpc`` and ``@serializable``.

Each decorator checks the class when it is applied and fails with a
:class:`~flows.errors.FlowDefinitionError` whose message says how to fix it, so a mistake
shows at import time rather than as a stuck flow on a peer node. What a decorator marks on a
class is written and read in :mod:`flows.markings`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar, overload

import attrs

from flows.errors import FlowDefinitionError
from flows.flow_logic import FlowLogic
from flows.markings import (
    InitiatingInfo,
    app_name_of,
    initiating_info,
    mark_initiating,
    mark_responder,
    mark_startable_by_rpc,
)
from foundation.serialization import PAYLOAD_TYPES, qualified_name
from statemachine.limits import APP_NAME_CHARS, FLOW_CLASS_CHARS

__all__ = [
    "InitiatingInfo",
    "flow_class_name_problem",
    "initiated_by",
    "initiating_flow",
    "serializable",
    "startable_by_rpc",
]

C = TypeVar("C", bound=type)


def _check_module_level(cls: type, decorator: str) -> None:
    if "<locals>" in cls.__qualname__:
        raise FlowDefinitionError(
            f"@{decorator} on {cls.__qualname__}: the class is defined inside a function, so a "
            "restarted node could not find it by name; move it to module level"
        )
    problem = flow_class_name_problem(cls)
    if problem is not None:
        raise FlowDefinitionError(f"@{decorator} on {cls.__qualname__}: {problem}")


def flow_class_name_problem(cls: type) -> str | None:
    """Why peers and the node database could not take ``cls``'s names, or None if they can.

    Its qualified name must fit in ``limits.FLOW_CLASS_CHARS`` and its CorDapp's name in
    ``limits.APP_NAME_CHARS`` (what a peer accepts in a session message).
    """
    name, app = qualified_name(cls), app_name_of(cls)
    if len(name) > FLOW_CLASS_CHARS:
        return (
            f"its qualified name has {len(name)} characters; the limit is {FLOW_CLASS_CHARS} "
            "(shorten the module path or the class name)"
        )
    if len(app) > APP_NAME_CHARS:
        return f"its CorDapp name {app[:40]!r}... is over {APP_NAME_CHARS} characters"
    return None


def _check_flow_class(cls: Any, decorator: str) -> None:
    if not isinstance(cls, type) or not issubclass(cls, FlowLogic):
        raise FlowDefinitionError(
            f"@{decorator} applies to FlowLogic subclasses, not {cls!r}; "
            f"declare it as `class {getattr(cls, '__name__', 'MyFlow')}(FlowLogic[...])`"
        )
    if cls.call is FlowLogic.call:
        raise FlowDefinitionError(
            f"@{decorator} on {cls.__qualname__}: the class does not define call(); "
            "add `def call(self) -> ...:` with the flow's logic"
        )
    _check_module_level(cls, decorator)


@overload
def initiating_flow(cls: C, /) -> C: ...


@overload
def initiating_flow(*, version: int = 1) -> Callable[[C], C]: ...


def initiating_flow(cls: Any = None, /, *, version: int = 1) -> Any:
    """Mark a flow that opens sessions; peers start their ``@initiated_by`` responder for it.

    Use as ``@initiating_flow`` or ``@initiating_flow(version=2)``.
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FlowDefinitionError(
            f"@initiating_flow(version=...) needs an int >= 1, not {version!r}"
        )

    def decorate(target: C) -> C:
        _check_flow_class(target, "initiating_flow")
        mark_initiating(
            target, InitiatingInfo(qualified_name(target), version, app_name_of(target))
        )
        return target

    return decorate if cls is None else decorate(cls)


def initiated_by(initiator: type) -> Callable[[C], C]:
    """Mark a responder: the flow a node starts when a peer's ``initiator`` opens a session.

    The responder's constructor takes the session: ``def __init__(self, session: FlowSession)``.
    """
    if not isinstance(initiator, type) or initiating_info(initiator) is None:
        name = getattr(initiator, "__qualname__", repr(initiator))
        raise FlowDefinitionError(
            f"@initiated_by({name}): {name} is not an @initiating_flow; "
            f"put @initiating_flow above `class {name}`"
        )

    def decorate(cls: C) -> C:
        _check_flow_class(cls, "initiated_by")
        try:
            inspect.signature(cls).bind(object())
        except TypeError:
            raise FlowDefinitionError(
                f"@initiated_by on {cls.__qualname__}: its constructor must take the session as "
                f"its one argument: `def __init__(self, session: FlowSession) -> None`"
            ) from None
        mark_responder(cls, initiator)
        return cls

    return decorate


def startable_by_rpc(cls: C) -> C:
    """Allow clients to start this flow from outside the node.

    The node's HTTP API starts only flows marked so (to users whose ``start`` permission
    names the class, or ``"*"``; docs/rpc.md), and so do schedules and ``fiberflow flow
    start`` (through ``--url`` or ``--config``).
    """
    _check_flow_class(cls, "startable_by_rpc")
    mark_startable_by_rpc(cls)
    return cls


def serializable(cls: C) -> C:
    """Allow instances of an attrs class as payloads, arguments and results of flows."""
    is_attrs_class: bool = attrs.has(cls)
    if not is_attrs_class:
        raise FlowDefinitionError(
            f"@serializable on {cls.__qualname__}: only attrs classes can be serialized; "
            "put @attrs.frozen under @serializable"
        )
    _check_module_level(cls, "serializable")
    PAYLOAD_TYPES.register(cls)
    return cls
