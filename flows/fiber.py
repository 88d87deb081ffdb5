"""The greenlet glue: the only module that imports greenlet and switches.

Each flow's ``call()`` runs in its own greenlet. When flow code suspends (every session
operation, sleep and journaled value goes through :meth:`_FiberRuntime.suspend`), the fiber
switches back to the scheduler with a ``Suspended(request)``; the scheduler later switches in
again with the request's value, or throws the request's error into it. When ``call()``
returns or raises, the fiber ends with ``Returned`` or ``Failed``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import greenlet

from flows.busy import BusyMonitor
from flows.effects import FlowEffect, FlowEffectRegistry
from flows.errors import error_from_exception, exception_from_error
from flows.flow_logic import FlowInfo, FlowLogic, FlowSession
from flows.party import Party
from persistence.serialization import Serializer
from statemachine.flow_error import FlowError
from statemachine.iorequests import IORequest, Plain
from statemachine.ports import Failed, FiberOutcome, Returned, Suspended
from statemachine.state import FlowOrigin, InitiatedBy, StartedLocally

log = logging.getLogger("fiberflow.fiber")

_OUTCOMES = (Suspended, Returned, Failed)


class _FiberRuntime:
    """What a running flow uses to reach the node (see ``flows.flow_logic.FlowRuntime``)."""

    def __init__(
        self,
        fiber: GreenletFiber,
        flow_id: str,
        our_identity: Party,
        clock_now: Callable[[], float],
        effects: FlowEffectRegistry,
        default_receive_timeout: float | None,
        payloads: Serializer,
        max_payload_bytes: int,
    ) -> None:
        self._fiber: GreenletFiber | None = fiber
        """None once the flow has ended (see :meth:`GreenletFiber._run`)."""
        self.flow_id = flow_id
        self.our_identity = our_identity
        self.clock_now = clock_now
        self.default_receive_timeout = default_receive_timeout
        self.payloads = payloads
        """The node's payload serializer."""
        self.max_payload_bytes = max_payload_bytes
        """The largest payload that fits in one of the node's session messages."""
        self._effects = effects
        self._next_effect = 0

    def suspend(self, request: IORequest) -> Plain:
        """Switch to the scheduler with ``request``; return (or raise) what it sends back."""
        if self._fiber is None:
            raise RuntimeError(
                f"flow {self.flow_id} has ended: its sessions and operations cannot be used"
            )
        return self._fiber.suspend(request)

    def register_effect(self, label: str, effect: FlowEffect) -> int:
        """Keep ``effect`` for the transaction of this step; returns its ordinal."""
        ordinal = self._next_effect
        self._next_effect += 1
        flow_class = "" if self._fiber is None else self._fiber.flow_class
        self._effects.register(self.flow_id, ordinal, label, effect, flow_class)
        return ordinal


class GreenletFiber:
    """A flow's ``call()`` in a greenlet (implements ``statemachine.ports.Fiber``)."""

    def __init__(
        self,
        build: Callable[[_FiberRuntime], FlowLogic[Any]],
        flow_id: str,
        our_identity: Party,
        clock_now: Callable[[], float],
        effects: FlowEffectRegistry,
        default_receive_timeout: float | None,
        monitor: BusyMonitor,
        flow_class: str,
        *,
        payloads: Serializer,
        max_payload_bytes: int,
    ) -> None:
        self._runtime = _FiberRuntime(
            self,
            flow_id,
            our_identity,
            clock_now,
            effects,
            default_receive_timeout,
            payloads,
            max_payload_bytes,
        )
        self._monitor = monitor
        self.flow_class = flow_class
        """The flow's class name (for the busy-flow watchdog's messages)."""
        self._build: Callable[[_FiberRuntime], FlowLogic[Any]] | None = build
        self._greenlet = greenlet.greenlet(self._run)
        self._resumer: greenlet.greenlet | None = None

    def _run(self, _: Plain) -> FiberOutcome:
        build, self._build = self._build, None
        try:
            assert build is not None, "a fiber runs once"
            flow = build(self._runtime)
            del build  # its closure refers to the flow instance a local start made
            result = flow.call()
            return Returned(self._runtime.payloads.encode(result))
        except greenlet.GreenletExit:
            raise
        except Exception as error:
            log.debug("flow %s raised", self._runtime.flow_id, exc_info=True)
            return Failed(error_from_exception(error))
        finally:
            # The flow, its runtime and this fiber refer to each other: break the circle, so
            # that an ended flow is freed by reference counting at once, not by a collection
            # of the cyclic garbage collector (which walks every live object of the node).
            self._runtime._fiber = None

    def suspend(self, request: IORequest) -> Plain:
        """Called from inside the flow: hand ``request`` to the scheduler."""
        if greenlet.getcurrent() is not self._greenlet or self._resumer is None:
            raise RuntimeError(
                "flow operations must be called from within the flow's call(), on its node"
            )
        value = self._resumer.switch(Suspended(request))
        return value  # type: ignore[no-any-return]

    def _switch_in(self, method: Callable[..., Any], *args: Any) -> FiberOutcome:
        if self._greenlet.dead:
            raise RuntimeError(f"flow {self._runtime.flow_id}: its fiber has already ended")
        self._resumer = greenlet.getcurrent()
        self._greenlet.parent = self._resumer
        outer = self._monitor.enter(self._runtime.flow_id, self.flow_class)
        try:
            outcome: FiberOutcome = method(*args)
        finally:
            self._monitor.leave(outer)
        if type(outcome) not in _OUTCOMES:
            raise RuntimeError(
                f"flow {self._runtime.flow_id} switched greenlets on its own: flows must not "
                "use greenlet or gevent directly"
            )
        return outcome

    def resume(self, value: Plain) -> FiberOutcome:
        """Start the fiber, or resume it with ``value``."""
        return self._switch_in(self._greenlet.switch, value)

    def throw(self, error: FlowError) -> FiberOutcome:
        """Resume the fiber by raising ``error`` where it suspended."""
        return self._switch_in(self._greenlet.throw, exception_from_error(error))

    def abort(self) -> None:
        """Kill the greenlet without running any more flow code (GreenletExit unwinds it)."""
        if not self._greenlet.dead and self._greenlet:
            self._greenlet.parent = greenlet.getcurrent()
            self._greenlet.throw(greenlet.GreenletExit)


def _import_flow_class(name: str) -> type[FlowLogic[Any]]:
    module_name, _, qualname = name.rpartition(".")
    while module_name:
        try:
            target: Any = importlib.import_module(module_name)
            break
        except ModuleNotFoundError:
            module_name, _, outer = module_name.rpartition(".")
            qualname = f"{outer}.{qualname}"
    else:
        raise LookupError(f"flow class {name} cannot be imported")
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if not (isinstance(target, type) and issubclass(target, FlowLogic)):
        raise LookupError(f"{name} is not a FlowLogic class")
    return target


class GreenletFiberFactory:
    """Creates fibers for a node (implements ``statemachine.ports.FiberFactory``).

    Every flow of the node serializes its payloads, arguments and result with ``payloads``
    (the node's limits) and may send payloads of up to ``max_payload_bytes``.
    """

    def __init__(
        self,
        our_identity: Party,
        clock_now: Callable[[], float],
        resolve: Callable[[str], type[FlowLogic[Any]] | None],
        effects: FlowEffectRegistry | None = None,
        default_receive_timeout: float | None = None,
        monitor: BusyMonitor | None = None,
        *,
        payloads: Serializer,
        max_payload_bytes: int,
    ) -> None:
        self._payloads = payloads
        self._max_payload_bytes = max_payload_bytes
        self._effects = effects if effects is not None else FlowEffectRegistry()
        self.monitor = monitor or BusyMonitor()
        """Which flow's code runs now (read by the node process's watchdog)."""
        self._default_receive_timeout = default_receive_timeout
        self._our_identity = our_identity
        self._clock_now = clock_now
        self._resolve = resolve

    def _flow_class(self, name: str) -> type[FlowLogic[Any]]:
        return self._resolve(name) or _import_flow_class(name)

    def create(self, flow_id: str, origin: FlowOrigin, instance: object | None) -> GreenletFiber:
        """A fiber that builds the flow (or uses ``instance``) and runs its ``call()``."""

        def build(runtime: _FiberRuntime) -> FlowLogic[Any]:
            flow: FlowLogic[Any]
            if isinstance(instance, FlowLogic):
                flow = instance
            elif isinstance(origin, StartedLocally):
                args, kwargs = self._payloads.decode(origin.arguments)
                flow = self._flow_class(origin.flow_class)(*args, **kwargs)
            else:
                assert isinstance(origin, InitiatedBy)
                session = FlowSession(
                    runtime,
                    origin.session_id,
                    Party(origin.counterparty),
                    FlowInfo(origin.counterparty_flow_version, origin.counterparty_app_name),
                )
                flow = self._flow_class(origin.flow_class)(session)  # type: ignore[call-arg]
            flow._ff_bind(runtime, None)
            return flow

        return GreenletFiber(
            build,
            flow_id,
            self._our_identity,
            self._clock_now,
            self._effects,
            self._default_receive_timeout,
            self.monitor,
            origin.flow_class,
            payloads=self._payloads,
            max_payload_bytes=self._max_payload_bytes,
        )
