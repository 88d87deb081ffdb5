"""The greenlet glue: the only module that imports greenlet and switches.

Each flow's ``call()`` runs in its own greenlet. When flow code suspends (every session
operation, sleep and journaled value goes through :meth:`_FiberRuntime.suspend`), the fiber
switches back to the scheduler with a ``Suspended(request)``; the scheduler later switches in
again with the request's value, or throws the request's error into it. When ``call()``
returns or raises, the fiber ends with ``Returned`` or ``Failed``.

Greenlets are reused. Starting a greenlet costs its first frame's data stack (CPython maps
fresh memory for it) and ending one unmaps it: about 5 µs each, two per ping/pong, which
showed as 5% of a durable ping/pong's time in mmap and munmap. A *carrier* greenlet
(:func:`_carry`) runs one flow's ``call()`` after another: when a flow ends, its carrier
hands the outcome back as a finished greenlet would and waits, idle, in its thread's pool
(:class:`_Carriers`, at most :data:`IDLE_CARRIERS` of them) for the next flow to start. A
carrier keeps nothing of the flow it ran: the fiber lets go of it when the flow ends, it
gets a new, empty ``contextvars`` context for each flow, and an abort unwinds only the
flow's frames.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import greenlet

from flows.errors import error_from_exception, exception_from_error
from flows.flow_logic import FlowInfo, FlowLogic, FlowSession
from flows.node.busy import BusyMonitor
from flows.node.effects import FlowEffect, FlowEffectRegistry
from flows.party import Party
from flows.tracebacks import flow_traceback
from foundation.serialization import Serializer
from statemachine.flow_error import FlowError
from statemachine.iorequests import IORequest, Plain, RetryPolicy
from statemachine.ports import Failed, FiberOutcome, Returned, Suspended
from statemachine.state import FlowOrigin, InitiatedBy, StartedLocally

if TYPE_CHECKING:
    from flows.node.external_operations import ExternalOperations

log = logging.getLogger("fiberflow.fiber")

_OUTCOMES = (Suspended, Returned, Failed)

IDLE_CARRIERS = 256
"""The most idle carrier greenlets a thread keeps for flows to come."""


class _Aborted:
    """What a carrier hands back when an abort has unwound its flow (never a flow outcome)."""


_ABORTED = _Aborted()


class _Carriers(threading.local):
    """A thread's idle carrier greenlets (greenlets only ever run in their own thread)."""

    def __init__(self) -> None:
        self.idle: list[greenlet.greenlet] = []


_CARRIERS = _Carriers()


def _carry(handed: list[Callable[[], object]]) -> object:
    """Run the job ``handed`` holds (a fiber's flow), then wait in the pool for the next one.

    Jobs come in one-item lists that the carrier empties: greenlet keeps the arguments of a
    greenlet's first call for as long as the greenlet lives, and a carrier must not keep the
    first flow it ran. The outcome of each job goes to the carrier's parent (the fiber's
    resumer) as the ``switch`` that started or last resumed it returns. A full pool, or a
    GreenletExit thrown into an idle carrier (its thread or the pool is going away), ends
    the carrier.
    """
    me = greenlet.getcurrent()
    while True:
        job = handed.pop()
        outcome = job()
        del job
        idle = _CARRIERS.idle
        if len(idle) >= IDLE_CARRIERS:
            return outcome
        idle.append(me)
        try:
            handed = me.parent.switch(outcome)
        except greenlet.GreenletExit:
            return None
        finally:
            outcome = None


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
        operations: ExternalOperations | None = None,
        unknown_party: Callable[[str], str | None] | None = None,
    ) -> None:
        self._fiber: GreenletFiber | None = fiber
        self._unknown_party = unknown_party
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
        self._operations = operations
        self._next_operation = 0

    def unknown_party(self, name: str) -> str | None:
        """Why the node's network map does not know the party ``name``; None if it does."""
        if self._unknown_party is None or name == self.our_identity.name:
            return None
        return self._unknown_party(name)

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

    def register_operation(
        self, operation: Callable[[Any], Any], label: str, policy: RetryPolicy
    ) -> int:
        """Hand ``operation`` to the node's runner (it runs when asked); returns its ordinal."""
        if self._operations is None:
            raise RuntimeError(f"flow {self.flow_id}: this node runs no external operations")
        ordinal = self._next_operation
        self._next_operation += 1
        self._operations.register(self.flow_id, ordinal, operation, label, policy)
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
        operations: ExternalOperations | None = None,
        unknown_party: Callable[[str], str | None] | None = None,
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
            operations,
            unknown_party,
        )
        self._monitor = monitor
        self.flow_class = flow_class
        """The flow's class name (for the busy-flow watchdog's messages)."""
        self._build: Callable[[_FiberRuntime], FlowLogic[Any]] | None = build
        self._greenlet: greenlet.greenlet | None = None
        """The carrier running the flow: None before it starts and once it has ended."""
        self._ended = False
        self._aborting = False
        self._resumer: greenlet.greenlet | None = None

    def _run(self) -> FiberOutcome | _Aborted:
        build, self._build = self._build, None
        try:
            assert build is not None, "a fiber runs once"
            flow = build(self._runtime)
            del build  # its closure refers to the flow instance a local start made
            result = flow.call()
            return Returned(self._runtime.payloads.encode(result))
        except greenlet.GreenletExit:
            if self._aborting:
                return _ABORTED  # the flow's frames are unwound; the carrier lives on
            raise  # the carrier itself is being collected: let it end
        except Exception as error:
            log.debug("flow %s raised", self._runtime.flow_id, exc_info=True)
            return Failed(error_from_exception(error), flow_traceback(error))
        finally:
            # The flow, its runtime and this fiber refer to each other: break the circle, so
            # that an ended flow is freed by reference counting at once, not by a collection
            # of the cyclic garbage collector (which walks every live object of the node);
            # and let go of the carrier, which goes on to run other flows.
            self._runtime._fiber = None
            self._greenlet = None
            self._ended = True

    def suspend(self, request: IORequest) -> Plain:
        """Called from inside the flow: hand ``request`` to the scheduler."""
        if greenlet.getcurrent() is not self._greenlet or self._resumer is None:
            raise RuntimeError(
                "flow operations must be called from within the flow's call(), on its node"
            )
        value = self._resumer.switch(Suspended(request))
        return value  # type: ignore[no-any-return]

    def _carrier(self) -> greenlet.greenlet:
        """The greenlet to switch into: the flow's carrier, or one for it to start on."""
        if self._ended:
            raise RuntimeError(f"flow {self._runtime.flow_id}: its fiber has already ended")
        if self._greenlet is None:
            idle = _CARRIERS.idle
            self._greenlet = idle.pop() if idle else greenlet.greenlet(_carry)
            self._greenlet.gr_context = contextvars.Context()
        return self._greenlet

    def _switch_in(self, method: Callable[..., Any], *args: Any) -> FiberOutcome:
        self._resumer = greenlet.getcurrent()
        assert self._greenlet is not None
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
        started = self._greenlet is not None
        carrier = self._carrier()
        return self._switch_in(carrier.switch, value if started else [self._run])

    def throw(self, error: FlowError) -> FiberOutcome:
        """Resume the fiber by raising ``error`` where it suspended."""
        if self._greenlet is None and not self._ended:
            raise RuntimeError(f"flow {self._runtime.flow_id}: its fiber has not started")
        return self._switch_in(self._carrier().throw, exception_from_error(error))

    def abort(self) -> None:
        """Unwind the flow without running any more of its code (GreenletExit unwinds it)."""
        carrier = self._greenlet
        if carrier is not None and not self._ended:
            self._aborting = True
            carrier.parent = greenlet.getcurrent()
            carrier.throw(greenlet.GreenletExit)


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
        operations: ExternalOperations | None = None,
        unknown_party: Callable[[str], str | None] | None = None,
    ) -> None:
        """``unknown_party(name)``: why the network map does not know a party (None: it does)."""
        self._unknown_party = unknown_party
        self._payloads = payloads
        self._max_payload_bytes = max_payload_bytes
        self._operations = operations
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
            operations=self._operations,
            unknown_party=self._unknown_party,
        )
