"""Opening a node process's database, waiting (with backoff) while it cannot be reached."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.exc import SQLAlchemyError

from flows.config.runtime import RuntimeConfig
from foundation.engine import (
    application_name,
    first_line,
    is_permanent_connect_error,
    url_without_password,
)
from persistence.migration import SchemaVersionError
from persistence.store import NodeDatabase

log = logging.getLogger("fiberflow.runtime")


def open_node_database(
    config: RuntimeConfig, worker_id: str, stop: threading.Event
) -> NodeDatabase | None:
    """The node database of ``config``, for worker ``worker_id``; None if it must not start.

    One log line per attempt. A problem waiting cannot cure (a wrong password, a missing
    database, a schema of another version) ends the wait at once; so does running out of
    ``database_wait_seconds``, or ``stop`` being set. The reason is logged.
    """
    url = url_without_password(config.database_url)
    deadline = time.monotonic() + config.database_wait_seconds
    attempt = 0
    while True:
        attempt += 1
        try:
            return NodeDatabase(
                config.database_url,
                synchronous=config.synchronous,
                schema_name=config.database_schema,
                application_name=application_name(worker_id),
            )
        except SchemaVersionError as error:
            log.error("%s: %s; refusing to start", config.name, error)
            return None
        except (SQLAlchemyError, OSError) as error:
            problem = first_line(error)
            if is_permanent_connect_error(error):
                log.error("%s: cannot use the database %s: %s", config.name, url, problem)
                return None
            delay = min(0.5 * 2 ** (attempt - 1), 10.0)
            left = deadline - time.monotonic()
            if left <= 0:
                log.error(
                    "%s: gave up on the database %s after %d attempts in %.0f s: %s",
                    config.name,
                    url,
                    attempt,
                    config.database_wait_seconds,
                    problem,
                )
                return None
            delay = min(delay, left)
            log.warning(
                "%s: cannot reach the database %s (attempt %d): %s; next try in %.1f s",
                config.name,
                url,
                attempt,
                problem,
                delay,
            )
            if stop.wait(delay):
                return None
