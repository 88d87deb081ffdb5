"""Why ``fiberflow analyze`` could not run, said in one line.

Spark reports a failure through several layers: PySpark's own exceptions (an
``AnalysisException``, a JVM that will not start), Py4J's (``Py4JJavaError`` wrapping the
Java exception and its stack, ``Py4JNetworkError`` when the JVM is gone) and the socket's
(``ConnectionRefusedError``). :func:`spark_errors` names them all so the command can catch
them at its edge; :func:`first_line` keeps the one line an operator needs from their long
messages (the Java exception, not Py4J's "An error occurred while calling o123.sql").
"""

from __future__ import annotations

MAX_LINE = 300
"""The longest line :func:`first_line` returns (a Java message can be a query plan)."""

_PY4J_PREAMBLE = ("An error occurred while calling", "Trace:")


def spark_errors() -> tuple[type[BaseException], ...]:
    """The exception classes of Spark, its JVM and the Py4J gateway between them.

    Imported here, not at module level, so the command line loads without PySpark.
    """
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return (PySparkException, Py4JError, ConnectionError)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"


def _text(error: BaseException) -> str:
    """``str(error)``; a PySpark error whose own ``__str__`` fails gives its message, else ""."""
    try:
        return str(error)
    except Exception:
        getter = getattr(error, "getMessage", None)
        try:
            return str(getter()) if callable(getter) else ""
        except Exception:
            return ""


def _meaningful_line(error: BaseException) -> str:
    lines = [line.strip().removeprefix(": ").strip() for line in _text(error).splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        if not line.startswith(_PY4J_PREAMBLE):
            return line
    return lines[0] if lines else ""


def first_line(error: BaseException) -> str:
    """The line of ``error`` that says what went wrong, with its cause's when it has one.

    Py4J's own preamble is skipped for the Java exception under it; an error with no
    message is named by its class; a cause (the ``ConnectionRefusedError`` under a
    ``Py4JNetworkError``) is added in brackets.
    """
    line = _meaningful_line(error) or type(error).__name__
    cause = getattr(error, "cause", None) or error.__cause__  # Py4J keeps it in .cause
    if isinstance(cause, BaseException):
        said = _meaningful_line(cause)
        described = f"{type(cause).__name__}: {said}" if said else type(cause).__name__
        if said not in line:
            line = f"{line} ({described})"
    return _clip(line)
