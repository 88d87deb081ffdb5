"""``fiberflow node run``: load the config, run the node process, exit with its status.

The exit status is :class:`~flows.process.process.NodeProcess`'s: 0 after a clean stop, 2 when
the node could not start (a bad config, another process holding the node, a start-up failure
in one line), 3 when the process lost the node's lease while it ran.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from flows.config.runtime import ConfigError, load_config
from flows.process.logs import configure_logging
from flows.process.process import EXIT_REFUSED, NodeProcess
from foundation.engine import first_line
from statemachine.limits import WORKER_NAME_CHARS

log = logging.getLogger("fiberflow.runtime")


def run_node(
    config_path: str | Path, worker: str | None = None, log_level: str | None = None
) -> int:
    """``fiberflow node run``: load the config, run the node; returns the exit code.

    With ``worker``, as that worker of a node run by several workers (PostgreSQL only).
    ``log_level`` (the command line's ``--log-level``) overrides the config's ``log_level``.
    """
    problem = None if worker is None else worker_name_problem(worker)
    if problem is not None:
        print(f"fiberflow node run: --worker: {problem}", file=sys.stderr)
        return 2
    try:
        config = load_config(config_path)
    except ConfigError as error:
        print(f"fiberflow node run: {error}", file=sys.stderr)
        return 2
    configure_logging(log_level or config.log_level)
    try:
        return NodeProcess(config, worker_name=worker).run()
    except Exception as error:  # a start-up failure: one line; the traceback at DEBUG only
        log.debug("%s: the node could not start", config.name, exc_info=True)
        print(f"fiberflow node run: {config.name}: {startup_problem(error)}", file=sys.stderr)
        return EXIT_REFUSED


def startup_problem(error: BaseException) -> str:
    """One line saying why a command could not start: the error's class and first line.

    (Run with ``--log-level DEBUG`` for the traceback.)
    """
    return f"{type(error).__name__}: {first_line(error)}"


def worker_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a worker, or None."""
    if not name or len(name) > WORKER_NAME_CHARS:
        return f"a worker's name has 1 to {WORKER_NAME_CHARS} characters"
    if not all(c.isalnum() or c in "-_." for c in name):
        return f"{name!r}: a worker's name has letters, digits, '-', '_' and '.' only"
    return None
