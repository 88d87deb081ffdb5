"""The AMQP transport: node queues on a RabbitMQ broker.

Each node has an inbound and a dead-letter queue named after its node key, bound to the
``p2p.inbound`` and ``p2p.deadletter`` direct exchanges. Sends are persistent, ``mandatory``
and confirmed; consumption uses manual acks under a prefetch window; both reconnect. By job:

* :mod:`messaging.amqp.connection`: connecting, closing, backoff, password-free URLs;
* :mod:`messaging.amqp.topology`: exchange and queue names, declaring them, publishing a frame;
* :mod:`messaging.amqp.publisher`: the confirm-mode publisher every sending thread shares;
* :mod:`messaging.amqp.consumer`: :class:`AmqpMessaging`, one node's ``MessagingService``;
* :mod:`messaging.amqp.admin`: set-up, permissions, reading dead letters, queue tools.
"""

from messaging.amqp.admin import (
    delete_queues,
    inject_raw,
    node_url,
    peer_account_commands,
    permission_commands,
    queue_depth,
    read_dead_letters,
    setup_topology,
    url_vhost,
)
from messaging.amqp.connection import DEFAULT_RECONNECT_SECONDS, backoff_seconds, safe_url
from messaging.amqp.consumer import DEFAULT_PREFETCH, AmqpMessaging
from messaging.amqp.topology import (
    DEAD_LETTER_EXCHANGE,
    INBOUND_EXCHANGE,
    REASON_HEADER,
    dead_letter_queue_name,
    node_key,
    queue_name,
    split_options,
)

__all__ = [
    "DEAD_LETTER_EXCHANGE",
    "DEFAULT_PREFETCH",
    "DEFAULT_RECONNECT_SECONDS",
    "INBOUND_EXCHANGE",
    "REASON_HEADER",
    "AmqpMessaging",
    "backoff_seconds",
    "dead_letter_queue_name",
    "delete_queues",
    "inject_raw",
    "node_key",
    "node_url",
    "peer_account_commands",
    "permission_commands",
    "queue_depth",
    "queue_name",
    "read_dead_letters",
    "safe_url",
    "setup_topology",
    "split_options",
    "url_vhost",
]
