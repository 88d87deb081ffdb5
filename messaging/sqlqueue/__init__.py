"""The SQL queue: durable message queues in database tables (the embedded default transport).

One queue database serves every node that shares it: a SQLite file for the nodes of one host
(the embedded default), or a PostgreSQL database for nodes on many hosts. By job:

* :mod:`messaging.sqlqueue.tables`: the three tables (queues, messages, dead letters);
* :mod:`messaging.sqlqueue.broker`: :class:`SqlQueueBroker`, what one database does for every
  node: enqueue, claim by count and bytes under leases, acknowledge, dead-letter;
* :mod:`messaging.sqlqueue.consumer`: :class:`SqlQueueMessaging`, one node's
  ``MessagingService``: its consumer thread, window, waking and buffered acknowledgements.
"""

from messaging.sqlqueue.broker import CLAIM_BATCH, CLAIM_BYTES, Claim, SqlQueueBroker
from messaging.sqlqueue.consumer import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_WINDOW,
    DEFAULT_WINDOW_BYTES,
    SqlQueueMessaging,
)
from messaging.sqlqueue.tables import metadata, queue_dead_letters, queue_messages, queues

__all__ = [
    "CLAIM_BATCH",
    "CLAIM_BYTES",
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_WINDOW",
    "DEFAULT_WINDOW_BYTES",
    "Claim",
    "SqlQueueBroker",
    "SqlQueueMessaging",
    "metadata",
    "queue_dead_letters",
    "queue_messages",
    "queues",
]
