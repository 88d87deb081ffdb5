"""``FlowLogic``, ``FlowSession`` and ``UntrustworthyData``: the API flow code is written against.

Every operation here that talks to another node, waits, or produces a non-deterministic value
builds an I/O request (:mod:`statemachine.iorequests`) and suspends the flow through its
runtime (:mod:`flows.node.fiber` is the only module that actually switches). Between suspensions,
flow code must be deterministic: on restart it is run again from the top and each request is
answered from the journal, so it must ask for the same things in the same order.
"""

from __future__ import annotations

import datetime
import functools
import math
import random as _random
import uuid as _uuid
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, NoReturn, Protocol, TypeVar, cast

import attrs

from flows.errors import FlowArgumentError, FlowException
from flows.markings import InitiatingInfo, initiating_info
from flows.party import Party
from foundation.serialization import SerializationError, Serializer
from statemachine.iorequests import (
    CloseSessions,
    ContinueAsNew,
    InitiateSession,
    IORequest,
    Plain,
    Receive,
    RecordValue,
    RetryPolicy,
    RunInTransaction,
    RunOperation,
    Send,
    SessionPayload,
    SetProgress,
    Sleep,
)
from statemachine.limits import ENVELOPE_HEADROOM, PROGRESS_STEP_CHARS

T = TypeVar("T")
R = TypeVar("R")


class UntrustworthyData(Generic[T]):
    """A value received from a counterparty. Call :meth:`unwrap` with a validator to use it.

    The counterparty may be malicious or buggy: the validator is where a flow checks that the
    value makes sense before acting on it (raise ``FlowException`` if it does not).
    """

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def unwrap(self, validator: Callable[[T], R]) -> R:
        """Pass the received value through ``validator`` and return what it returns."""
        return validator(self._value)

    def __repr__(self) -> str:
        return f"UntrustworthyData({type(self._value).__name__})"


class FlowRuntime(Protocol):
    """What a running flow needs from the node (implemented in :mod:`flows.node.fiber`)."""

    flow_id: str
    our_identity: Party
    payloads: Serializer
    """The node's payload serializer (its limits): what ``send`` and ``receive`` use."""
    max_payload_bytes: int
    """The largest payload that fits in one of the node's session messages."""

    def unknown_party(self, name: str) -> str | None:
        """Why the node's network map does not know the party ``name``; None if it does."""

    def suspend(self, request: IORequest) -> Plain:
        """Suspend the flow with ``request``; returns its result or raises its error."""

    def clock_now(self) -> float:
        """The node clock's current time (a candidate for ``FlowLogic.now``)."""

    @property
    def default_receive_timeout(self) -> float | None:
        """The node's receive timeout in seconds (None: wait forever)."""

    def register_effect(self, label: str, effect: Callable[[Any], None]) -> int:
        """Keep a side effect for the transaction of the current step; returns its ordinal."""

    def register_operation(
        self, operation: Callable[[Any], Any], label: str, policy: RetryPolicy
    ) -> int:
        """Hand an external operation to the node (run when asked); returns its ordinal."""


def operation_name(operation: Callable[..., Any]) -> str:
    """The name an external operation is journaled under (a partial's or an object's too)."""
    target: Any = operation
    while isinstance(target, functools.partial):
        target = target.func
    if not hasattr(target, "__qualname__"):
        target = type(target)
    return f"{getattr(target, '__module__', '?')}.{target.__qualname__}"


FOREVER = math.inf
"""``receive(..., timeout=FOREVER)`` waits without limit, whatever the node's default."""


def _resolve_timeout(runtime: FlowRuntime, timeout: float | None) -> float | None:
    if timeout is None:
        return runtime.default_receive_timeout
    if timeout == FOREVER:
        return None
    if not timeout > 0:
        raise ValueError(f"a receive timeout must be positive seconds, not {timeout!r}")
    return float(timeout)


class FlowNotRunningError(RuntimeError):
    """A flow operation was called on a flow that is not running on a node."""


class FlowLogic(Generic[T]):
    """Base class of every flow: subclass it and implement :meth:`call`.

    The constructor arguments are recorded automatically (a restarted node constructs the
    flow again from them), so they must be serializable: None, bool, int, float, str, bytes,
    list, tuple, dict, Party, or ``@serializable`` classes.
    """

    _ff_args: ClassVar[tuple[tuple[Any, ...], dict[str, Any]]] = ((), {})
    _ff_runtime: FlowRuntime | None = None
    _ff_initiator: InitiatingInfo | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        original = cls.__dict__.get("__init__")
        if original is None or getattr(original, "_ff_records_args", False):
            return

        @functools.wraps(original)
        def __init__(self: FlowLogic[Any], *args: Any, **kw: Any) -> None:
            if "_ff_args" not in self.__dict__:
                self.__dict__["_ff_args"] = (args, kw)
            original(self, *args, **kw)

        __init__._ff_records_args = True  # type: ignore[attr-defined]
        setattr(cls, "__init__", __init__)  # noqa: B010 (mypy forbids assigning a method)

    def call(self) -> T:
        """The flow's logic. Its return value is the flow's result."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement call()")

    # --- binding to a node --------------------------------------------------------------

    def _ff_bind(self, runtime: FlowRuntime, initiator: InitiatingInfo | None) -> None:
        self._ff_runtime = runtime
        own = initiating_info(type(self))
        self._ff_initiator = own if own is not None else initiator

    def _runtime(self) -> FlowRuntime:
        if self._ff_runtime is None:
            raise FlowNotRunningError(
                f"{type(self).__qualname__} is not running: start it with node.start_flow(...) "
                "or call it from another flow with self.sub_flow(...)"
            )
        return self._ff_runtime

    @property
    def flow_id(self) -> str:
        """The id of the running flow (a sub flow shares its parent's)."""
        return self._runtime().flow_id

    @property
    def our_identity(self) -> Party:
        """The party of the node this flow runs on."""
        return self._runtime().our_identity

    # --- operations ---------------------------------------------------------------------

    def initiate_flow(self, party: Party) -> FlowSession:
        """Open a session with ``party``; its node starts the responder of our initiating flow.

        Nothing is sent until the first ``send`` or ``receive`` on the session.
        """
        if not isinstance(party, Party):
            raise TypeError(f"initiate_flow needs a Party, not {type(party).__name__}")
        initiator = self._ff_initiator
        if initiator is None:
            raise FlowException(
                f"{type(self).__qualname__}.initiate_flow: no @initiating_flow in this flow's "
                "call stack; mark the flow (or the sub flow that opens sessions) @initiating_flow"
            )
        runtime = self._runtime()
        request = InitiateSession(
            party.name,
            initiator.flow_class,
            initiator.version,
            initiator.app_name,
            runtime.unknown_party(party.name) or "",
        )
        session_id = runtime.suspend(request)
        assert isinstance(session_id, str)
        return FlowSession(runtime, session_id, party)

    def sub_flow(self, flow: FlowLogic[R]) -> R:
        """Run ``flow`` inside this one and return its result.

        An ``@initiating_flow`` sub flow opens sessions in its own name (peers start the
        responder registered for it); any other sub flow is inlined and uses ours.
        """
        if not isinstance(flow, FlowLogic):
            raise TypeError(f"sub_flow needs a FlowLogic, not {type(flow).__name__}")
        flow._ff_bind(self._runtime(), self._ff_initiator)
        return flow.call()

    def sleep(self, seconds: float) -> None:
        """Suspend for ``seconds``. The wake-up time is checkpointed: it survives restarts."""
        self._runtime().suspend(Sleep(float(seconds)))

    def continue_as_new(self, *args: Any, **kwargs: Any) -> NoReturn:
        """End this run of ``call()`` and run the flow again, as new, built with these arguments.

        For flows that loop for ever: the journal starts empty, so the checkpoint stays small
        and a restart (or a wake-up after hibernation) replays only the current run. The flow
        keeps its id (its handle waits on); sessions it still talks on are ended as if it had
        finished; ``call()`` runs on a new instance, ``type(self)(*args, **kwargs)``, in the
        same commit. Only a flow started on its node can (a responder gets
        ``FlowDefinitionError``). Never returns.
        """
        runtime = self._runtime()
        arguments = encode_arguments(type(self)(*args, **kwargs), runtime.payloads)
        runtime.suspend(ContinueAsNew(arguments))
        raise AssertionError("a flow that continued as new is never resumed")

    def receive_all(
        self,
        receive_type: type[R],
        sessions: Sequence[FlowSession],
        timeout: float | None = None,
    ) -> list[UntrustworthyData[R]]:
        """Receive one message from each session; results are in the order of ``sessions``.

        ``timeout`` as in :meth:`FlowSession.receive`.
        """
        if not sessions:
            raise ValueError("receive_all needs at least one session")
        request = Receive(
            tuple(s.session_id for s in sessions), _resolve_timeout(self._runtime(), timeout)
        )
        payloads = self._runtime().suspend(request)
        assert isinstance(payloads, tuple)
        return [
            s._check(receive_type, cast(bytes, p)) for s, p in zip(sessions, payloads, strict=True)
        ]

    def in_transaction(self, effect: Callable[[Any], None], label: str = "effect") -> None:
        """Write to the node's own database exactly once, with this step's checkpoint.

        ``effect(connection)`` is called with the SQLAlchemy ``Connection`` of the
        transaction that commits the current step (the one that also writes the checkpoint,
        the consumed message ids and the outbound messages), when that step commits: not at
        once. If the node dies before the commit, the step is redone after the restart and
        the effect runs then; once committed, a replay never runs it again. So a table row
        the effect inserts appears exactly once per flow.

        The effect must only use the connection it is given (no commits, no other
        connections), must not raise for expected conditions (an exception rolls back the
        whole transaction, the node's round fails), and must not depend on anything that
        differs between runs. ``label`` names it in errors and the journal.
        """
        ordinal = self._runtime().register_effect(label, effect)
        self._runtime().suspend(RunInTransaction(label, ordinal))

    def call_external(
        self,
        operation: Callable[[Any], Any],
        *,
        label: str | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """Run ``operation`` off the flow (an HTTP call, a slow computation) and return its result.

        The flow suspends; the node runs ``operation(context)`` on its pool of threads (a
        coroutine function on its event loop), so other flows keep running meanwhile. The
        ``context`` (:class:`flows.node.external_operations.OperationContext`) carries an
        ``idempotency_key``,
        the same on every attempt and every re-run of this step: pass it to the service you
        call. The guarantee is **at least once**: if the node dies after the operation ended
        but before the flow's next checkpoint, it runs again with the same key. The result
        must be a payload (the allow-list applies); it is journaled, so a replay returns it
        without calling again.

        ``timeout`` (seconds) abandons an attempt that runs longer; ``retry``
        (:class:`RetryPolicy`) tries again after failures it names and timeouts, with backoff
        and jitter, the count kept in the checkpoint. A failure for good raises
        :class:`~flows.errors.OperationFailedException` here (``OperationTimeoutException``
        for a timeout); if the flow lets it escape, the flow is kept in the hospital with the
        operation pending again. ``label`` names the operation in errors (default: its name).
        """
        if not callable(operation):
            raise TypeError(f"call_external needs a callable, not {operation!r}")
        name = operation_name(operation)
        policy = retry if retry is not None else RetryPolicy()
        shown = label if label is not None else name.rpartition(".")[2]
        runtime = self._runtime()
        ordinal = runtime.register_operation(operation, shown, policy)
        value = runtime.suspend(RunOperation(shown, ordinal, name, timeout, policy))
        assert isinstance(value, bytes)
        return runtime.payloads.decode(value)

    def progress(self, step: str) -> None:
        """Report that the flow reached ``step`` (its progress tracker).

        The current step is stored with the flow's checkpoint and shown by
        ``fiberflow flow list``; name steps so an operator can tell where a flow is
        ("Collecting signatures", "Waiting for approval").
        """
        if not isinstance(step, str) or not 0 < len(step) <= PROGRESS_STEP_CHARS:
            raise ValueError(
                f"a progress step is a string of 1 to {PROGRESS_STEP_CHARS} characters"
            )
        self._runtime().suspend(SetProgress(step))

    def now(self) -> datetime.datetime:
        """The current time (UTC), journaled: a replay sees the same time."""
        value = self._runtime().suspend(RecordValue("now", self._runtime().clock_now()))
        assert isinstance(value, float)
        return datetime.datetime.fromtimestamp(value, tz=datetime.UTC)

    def random(self) -> float:
        """A random float in [0, 1), journaled: a replay sees the same value."""
        value = self._runtime().suspend(RecordValue("random", _random.random()))
        assert isinstance(value, float)
        return value

    def uuid(self) -> str:
        """A random UUID string, journaled: a replay sees the same value."""
        value = self._runtime().suspend(RecordValue("uuid", str(_uuid.uuid4())))
        assert isinstance(value, str)
        return value


@attrs.frozen
class FlowInfo:
    """The version and CorDapp of the flow at the other end of a session."""

    flow_version: int
    app_name: str


class FlowSession:
    """One end of a conversation with a flow on another node."""

    def __init__(
        self,
        runtime: FlowRuntime,
        session_id: str,
        counterparty: Party,
        counterparty_flow_info: FlowInfo | None = None,
    ) -> None:
        self._runtime = runtime
        self.session_id = session_id
        self._counterparty = counterparty
        self._counterparty_flow_info = counterparty_flow_info

    @property
    def counterparty_flow_info(self) -> FlowInfo:
        """The initiating flow's version and app name, on the session that started this flow.

        A responder uses it to speak the protocol of the version that called it:
        ``if session.counterparty_flow_info.flow_version < 2: ...``.
        """
        if self._counterparty_flow_info is None:
            raise FlowException(
                "the counterparty's flow info is known on the session that started this "
                "(initiated) flow"
            )
        return self._counterparty_flow_info

    @property
    def counterparty(self) -> Party:
        """The party at the other end."""
        return self._counterparty

    def send(self, payload: object) -> None:
        """Send ``payload`` (it must be serializable: see ``FlowLogic``).

        Raises ``SerializationError`` (in the flow, before anything is sent) if the payload
        breaks a serialization rule or is too large to fit in a session message.
        """
        data = self._runtime.payloads.encode(payload)
        limit = self._runtime.max_payload_bytes
        if len(data) > limit:
            raise SerializationError(
                f"payload of {len(data)} bytes to {self._counterparty} breaks the rule "
                f"max_payload_bytes: at most {limit} bytes fit in a session message (the "
                f"wire limits less {ENVELOPE_HEADROOM} bytes for the envelope)"
            )
        self._runtime.suspend(Send((SessionPayload(self.session_id, data),)))

    def receive(self, receive_type: type[T], timeout: float | None = None) -> UntrustworthyData[T]:
        """Wait for the next message; raises ``FlowException`` if it is not a ``receive_type``.

        If nothing arrives within ``timeout`` seconds (the node's default when None;
        ``FOREVER`` to wait without limit), raises ``FlowTimeoutException``. The deadline is
        durable: it survives restarts.
        """
        request = Receive((self.session_id,), _resolve_timeout(self._runtime, timeout))
        payloads = self._runtime.suspend(request)
        assert isinstance(payloads, tuple) and len(payloads) == 1
        return self._check(receive_type, cast(bytes, payloads[0]))

    def send_and_receive(
        self, receive_type: type[T], payload: object, timeout: float | None = None
    ) -> UntrustworthyData[T]:
        """Send ``payload``, then wait for the reply (``timeout`` as in :meth:`receive`)."""
        self.send(payload)
        return self.receive(receive_type, timeout)

    def close(self) -> None:
        """End the session: the counterparty's next receive on it fails as ended."""
        self._runtime.suspend(CloseSessions((self.session_id,)))

    def _check(self, receive_type: type[T], payload: bytes) -> UntrustworthyData[T]:
        try:
            value = self._runtime.payloads.decode(payload)
        except SerializationError as error:
            raise FlowException(
                f"received an unreadable payload from {self._counterparty}: {error}"
            ) from None
        if not isinstance(value, receive_type):
            raise FlowException(
                f"expected {receive_type.__qualname__} from {self._counterparty} on session "
                f"{self.session_id} but received {type(value).__qualname__}"
            )
        return UntrustworthyData(value)

    def __repr__(self) -> str:
        return f"FlowSession({self.session_id} with {self._counterparty})"


def encode_arguments(flow: FlowLogic[Any], payloads: Serializer) -> bytes:
    """Serialize a flow's constructor arguments, naming the first one that cannot be.

    ``payloads`` is the serializer of the node that will run the flow (a client that only
    records the request uses the default limits).
    """
    args, kwargs = flow._ff_args
    try:
        return payloads.encode((list(args), kwargs))
    except SerializationError as whole:
        # Name the argument at fault: encode them one by one (only when something failed).
        named: list[tuple[str, Any]] = [(f"argument {i + 1}", a) for i, a in enumerate(args)]
        named += [(f"argument {k!r}", v) for k, v in kwargs.items()]
        for label, value in named:
            try:
                payloads.encode(value)
            except SerializationError as error:
                raise FlowArgumentError(
                    f"{type(flow).__qualname__}: {label} cannot be checkpointed: {error}"
                ) from None
        raise FlowArgumentError(
            f"{type(flow).__qualname__}: its arguments cannot be checkpointed: {whole}"
        ) from None
