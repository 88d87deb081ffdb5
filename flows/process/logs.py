"""The log lines of fiberflow's commands and node processes: a format, a level, quiet libraries."""

from __future__ import annotations

import logging

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""The levels ``log_level`` and ``--log-level`` take."""


CHATTY_LIBRARIES = ("pika", "alembic")
"""Libraries whose INFO lines (every connection step; Alembic's at every schema check) are
shown only at DEBUG."""


CONNECTION_FAILURE_LOGGERS = (
    "pika.adapters.blocking_connection",
    "pika.adapters.utils.connection_workflow",
    "pika.adapters.utils.io_services_utils",
    "pika.connection",
)
"""pika's loggers that report a failed connection attempt in ten ERROR lines and a traceback:
shown only at DEBUG, since fiberflow reports each attempt (and a final failure) in one line."""


def configure_logging(level: str) -> None:
    """Log lines with time, level and logger to stderr, at ``level`` (one of LOG_LEVELS).

    The chatty libraries log at WARNING and above unless ``level`` is DEBUG. (Like
    ``logging.basicConfig``, it leaves a root logger that already has handlers alone.)
    """
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    quiet = logging.DEBUG if level == "DEBUG" else max(logging.WARNING, getattr(logging, level))
    for library in CHATTY_LIBRARIES:
        logging.getLogger(library).setLevel(quiet)
    silent = logging.DEBUG if level == "DEBUG" else logging.CRITICAL
    for name in CONNECTION_FAILURE_LOGGERS:
        logging.getLogger(name).setLevel(silent)
