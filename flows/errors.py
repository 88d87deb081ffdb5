"""The exceptions flow code sees, and their conversion to and from ``FlowError`` data.

Blame is in the name: :class:`FlowException` is raised on purpose by flow code (it crosses to
the counterparty with its message); :class:`UnexpectedFlowEndException` means the
counterparty ended without the message you waited for (it finished, failed with an internal
error whose detail stays on its node, or its node refused the session);
:class:`FlowNonDeterminismError` means your flow code asked for something else on replay
than it did the first time.
"""

from __future__ import annotations

import sys

from flows.tracebacks import FlowTraceback
from foundation.serialization import qualified_name
from statemachine.flow_error import ErrorKind, FlowError


class FiberflowError(Exception):
    """Root of fiberflow's exceptions."""


class FlowException(FiberflowError):
    """Raised by flow code to end the flow; every counterparty sees it with its message."""


class UnexpectedFlowEndException(FiberflowError):
    """The counterparty flow ended (or was never started) before sending what we expected."""


class FlowNonDeterminismError(FiberflowError):
    """Replay diverged from the journal: the flow is kept in the hospital, not run."""


class FlowFailedError(FiberflowError):
    """A flow failed with an error whose original class cannot be rebuilt here."""


class UnknownPartyError(FiberflowError):
    """``initiate_flow`` named a party the node's network map does not know."""


class FlowTimeoutException(FlowException):
    """A receive waited longer than its timeout (``receive(type, timeout=...)``)."""


class OperationFailedException(FlowException):
    """An external operation (``FlowLogic.call_external``) failed for good.

    Its message names the exception the operation raised and the attempt it was. Raised where
    the flow called the operation; a flow that does not catch it is kept in the hospital with
    the operation pending again (an operator's retry runs it afresh).
    """


class OperationTimeoutException(OperationFailedException):
    """The last attempt of an external operation outlived its ``timeout``."""


class FlowKilledException(FiberflowError):
    """The flow was killed by an operator (``Node.kill_flow``)."""


class IncompatibleCheckpointError(FiberflowError):
    """A stored checkpoint the installed flows cannot resume (class gone, version changed)."""


class FlowStillRunningError(FiberflowError):
    """``FlowHandle.result()`` was asked for a flow that has not finished yet."""


class FlowDefinitionError(TypeError):
    """A flow class is declared wrongly (raised when a decorator is applied)."""


class FlowArgumentError(ValueError):
    """A flow was started with an argument that cannot be checkpointed."""


def error_from_exception(exception: BaseException) -> FlowError:
    """Describe an exception raised by flow code as data."""
    cls = type(exception)
    if isinstance(exception, FlowException):
        kind = ErrorKind.FLOW_EXCEPTION
    elif isinstance(exception, FlowNonDeterminismError):
        kind = ErrorKind.NON_DETERMINISM
    else:
        kind = ErrorKind.INTERNAL
    return FlowError(kind, qualified_name(cls), str(exception))


def _loaded_class(name: str, base: type[BaseException]) -> type[BaseException] | None:
    """The class ``name`` if its module is already imported and it subclasses ``base``.

    Never imports anything: a class name that came from a peer must not make us run code.
    """
    module_name, _, qualname = name.rpartition(".")
    module = sys.modules.get(module_name)
    target: object = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if isinstance(target, type) and issubclass(target, base):
        return target
    return None


def exception_from_error(error: FlowError, traceback: str = "") -> BaseException:
    """The exception flow code (or a handle's ``result()``) sees for ``error``.

    With the ``traceback`` its node stored, the exception's ``__cause__`` is a
    :class:`~flows.tracebacks.FlowTraceback` holding it (printed above the caller's frames).
    """
    exception = _rebuilt_exception(error)
    if traceback:
        exception.__cause__ = FlowTraceback(traceback)
    return exception


def _rebuilt_exception(error: FlowError) -> BaseException:
    if error.kind is ErrorKind.UNEXPECTED_END:
        return UnexpectedFlowEndException(error.message)
    if error.kind is ErrorKind.NON_DETERMINISM:
        return FlowNonDeterminismError(error.message)
    base: type[BaseException] = (
        FlowException if error.kind is ErrorKind.FLOW_EXCEPTION else Exception
    )
    cls = _loaded_class(error.exception_class, base) if error.exception_class else None
    if cls is not None:
        try:
            return cls(error.message)
        except Exception:  # a constructor with other arguments: fall back below
            pass
    if error.kind is ErrorKind.FLOW_EXCEPTION:
        return FlowException(error.message)
    return FlowFailedError(f"{error.exception_class}: {error.message}")
