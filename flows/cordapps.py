"""CorDapps: the modules holding a node's flows, and the responder table built from them."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from flows.flow_logic import FlowLogic
from flows.markings import app_name_of, initiating_info, responder_initiator
from foundation.serialization import qualified_name
from statemachine.ports import Responder
from statemachine.state import Checkpoint, InitiatedBy


class CordappError(ValueError):
    """A CorDapp module cannot be loaded, or two of them clash."""


def _modules(name: str) -> Iterable[ModuleType]:
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise CordappError(f"cordapp module {name!r} cannot be imported: {error}") from error
    yield module
    path = getattr(module, "__path__", None)
    if path is not None:
        for info in pkgutil.walk_packages(path, prefix=f"{name}."):
            yield importlib.import_module(info.name)


class Cordapps:
    """The flows of a node's CorDapps and which responder answers which initiating flow."""

    def __init__(self, module_names: Sequence[str]) -> None:
        self.module_names = tuple(module_names)
        self._flows: dict[str, type[FlowLogic[Any]]] = {}
        self._responders: dict[str, type[FlowLogic[Any]]] = {}
        for name in self.module_names:
            for module in _modules(name):
                for value in vars(module).values():
                    if isinstance(value, type) and issubclass(value, FlowLogic):
                        self._add(value)

    def _add(self, cls: type[FlowLogic[Any]]) -> None:
        if cls is FlowLogic:
            return
        self._flows[qualified_name(cls)] = cls
        initiator = responder_initiator(cls)
        if initiator is None:
            return
        key = qualified_name(initiator)
        existing = self._responders.get(key)
        if existing is not None and existing is not cls:
            raise CordappError(
                f"two responders for {key} in one node: {qualified_name(existing)} and "
                f"{qualified_name(cls)}; a node may install only one of them"
            )
        self._responders[key] = cls

    def compatibility_problem(self, checkpoint: Checkpoint) -> str | None:
        """Why the installed flows cannot resume ``checkpoint``, or None if they can.

        The flow's class must be installed; every session the flow opened must have been
        opened by an initiating flow of the version installed now (a replay would otherwise
        speak another protocol version); a responder must still be the one installed for
        its initiator.
        """
        name = checkpoint.flow_class
        if self.resolve(name) is None:
            return (
                f"flow class {name} is not installed "
                f"(cordapps: {', '.join(self.module_names) or 'none'})"
            )
        for session in checkpoint.sessions:
            if not session.initiated_by_us:
                continue
            initiator = self.resolve(session.initiating_flow)
            info = initiating_info(initiator) if initiator is not None else None
            if info is None:
                return f"initiating flow {session.initiating_flow} is not installed"
            if info.version != session.flow_version:
                return (
                    f"session {session.session_id} was opened by {session.initiating_flow} "
                    f"version {session.flow_version}; version {info.version} is installed "
                    "(drain flows before changing a flow's version)"
                )
        origin = checkpoint.origin
        if isinstance(origin, InitiatedBy):
            started = checkpoint.session(origin.session_id)
            initiator_class = started.initiating_flow if started is not None else None
            responder = self.responder_for(initiator_class) if initiator_class else None
            if responder is None or responder.flow_class != name:
                return f"{name} is no longer the responder installed for {initiator_class}"
        return None

    def resolve(self, name: str) -> type[FlowLogic[Any]] | None:
        """The flow class called ``name``: from the CorDapps, else imported; None if neither."""
        found = self.flow_class(name)
        if found is not None:
            return found
        module_name, _, qualname = name.rpartition(".")
        while module_name:
            try:
                target: Any = importlib.import_module(module_name)
            except ImportError:
                module_name, _, outer = module_name.rpartition(".")
                qualname = f"{outer}.{qualname}"
                continue
            for part in qualname.split("."):
                target = getattr(target, part, None)
            if isinstance(target, type) and issubclass(target, FlowLogic):
                return target
            return None
        return None

    def responder_for(self, initiator_class: str) -> Responder | None:
        """The responder this node starts for ``initiator_class``, or None."""
        cls = self._responders.get(initiator_class)
        if cls is None:
            return None
        info = initiating_info(cls)
        version = info.version if info is not None else 1
        return Responder(qualified_name(cls), version, app_name_of(cls))

    def flow_class(self, name: str) -> type[FlowLogic[Any]] | None:
        """The flow class of this qualified name in the CorDapps, or None."""
        return self._flows.get(name)

    def flow_classes(self) -> list[str]:
        """Qualified names of every flow in the CorDapps, sorted."""
        return sorted(self._flows)

    def initiating_flows(self) -> list[str]:
        """Qualified names of the ``@initiating_flow`` classes, sorted."""
        return sorted(n for n, c in self._flows.items() if initiating_info(c) is not None)
