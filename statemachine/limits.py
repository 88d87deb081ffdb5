"""How long each field fiberflow takes from outside may be: every limit, in one place.

Decoders refuse a field over its limit (naming the field and the limit) before anything
stores it, and the database columns that store a field are exactly as wide as its limit, so a
value that got past a decoder always fits its column. ``persistence/schema.py``, the SQL
queue's tables, ``messaging/frame.py``, the session message classes (their annotations, see
:mod:`statemachine.wire_fields`) and ``flows/party.py`` take their sizes from here, and
``tests/unit/test_limits.py`` checks that they agree. :func:`text_problem` is the one check of a
text field against its limit.

Lengths are in characters (what a PostgreSQL ``varchar(n)`` counts), sizes in bytes.

The ids fiberflow generates always fit (checked by the same test):

* a flow id has at most ``FLOW_ID_CHARS`` (64) characters (32 hex for the flows a node
  starts or responds with; a client's request id is checked against the limit);
* a session id is ``<16 hex tag>-<flow id>.s<n>`` and its responder side adds ``.r``:
  ``16 + 1 + 64 + 2 + digits(n) + 2`` is at most ``SESSION_ID_CHARS`` (120) for any session
  number below ``10**35``;
* a message id is ``N-<sender session id>-<sequence>``: ``2 + 120 + 1 + 13`` characters at
  most (a sequence number is at most ``MAX_SEQUENCE``, 13 digits), under ``MESSAGE_ID_CHARS``.
"""

from __future__ import annotations

FRAME_BYTES = 16 * 1024 * 1024
"""Largest frame (a whole transport message) a sender writes or a receiver decodes.

A receiver refuses a larger one before decoding it (and the SQL queue before loading it).
"""

ENVELOPE_HEADROOM = 64 * 1024
"""Bytes kept free, beside a payload, for its session message and frame (ids, names, a
signature): a payload that fits under a node's serialization limits less this always fits on
the wire (``SessionCodec.max_payload_bytes``)."""

MESSAGE_ID_CHARS = 200
"""A message id: the frame's ``message_id``; ``node_message_ids``, ``node_outbox`` and
``node_dead_letters.message_id``."""

PARTY_NAME_CHARS = 300
"""A node's name (``Party``), which is also its address: a frame's claimed ``sender``; the
``sender`` and ``target`` columns."""

SESSION_ID_CHARS = 120
"""A session id: ``ExistingSessionMessage.recipient_session_id``;
``node_message_ids.session_id``."""

INITIATOR_SESSION_ID_CHARS = SESSION_ID_CHARS - 2
"""An initiator's session id (``InitialSessionMessage.initiator_session_id``): the responder's
side of the session is that id and ``.r``, which must fit in ``SESSION_ID_CHARS``."""

FLOW_ID_CHARS = 64
"""A flow id (and a client's flow request id): every ``flow_id`` / ``request_id`` column."""

FLOW_CLASS_CHARS = 300
"""A flow class's qualified name: ``InitialSessionMessage.initiator_flow_class``; every
``flow_class`` column."""

EXCEPTION_CLASS_CHARS = 300
"""An exception class's qualified name: ``FlowError.exception_class`` on the wire;
``node_flow_exceptions.exception_class``."""

APP_NAME_CHARS = 200
"""The CorDapp (app) name in ``InitialSessionMessage`` and ``ConfirmSession``."""

TOPIC_CHARS = 200
"""A frame's topic."""

ERROR_ID_CHARS = MESSAGE_ID_CHARS
"""``FlowError.error_id`` on the wire."""

ERROR_MESSAGE_CHARS = 8192
"""An error message (``FlowError.message``): longer ones are cut when made, refused from the
wire. Stored in text columns."""

REJECT_REASON_CHARS = ERROR_MESSAGE_CHARS
"""``SessionReject.reason`` (it becomes the error message of the initiator's flow)."""

PROGRESS_STEP_CHARS = 200
"""A flow's progress step (``FlowLogic.progress``; ``node_checkpoints.progress_step``). Set by
the node's own flows, not from outside, but bounded here with the rest."""

MAX_SEQUENCE = 2**40
"""Largest sequence number accepted from the wire (``node_message_ids.sequence`` is 64-bit)."""

DEAD_LETTER_REASON_CHARS = 4096
"""Longest reason stored with a dead letter (a longer one is cut, with a digest of the whole);
it also bounds the reason header of an AMQP dead letter."""

DEAD_LETTER_PREFIX_BYTES = 64 * 1024
"""How much of a body over ``FRAME_BYTES`` a transport keeps as its dead letter when it does
not keep it whole (AMQP, the in-memory double, the SQL queue on SQLite)."""

QUEUE_NAME_CHARS = 512
"""The SQL queue's queue names (``ff_queues.name``, the ``queue`` columns): room for any
address; a node's address is its name, at most ``PARTY_NAME_CHARS``."""

QUEUE_MESSAGE_ID_CHARS = 512
"""The SQL queue's ``message_id`` columns (as wide as earlier versions made them): a sender
only writes ids within ``MESSAGE_ID_CHARS``; a dead letter's is a bounded copy."""


def text_problem(name: str, value: object, limit: int, *, may_be_empty: bool = False) -> str | None:
    """Why ``value`` is not acceptable as text field ``name`` (at most ``limit``), or None.

    Text must be a ``str`` of 1 (0 if ``may_be_empty``) to ``limit`` characters without a NUL
    character (PostgreSQL cannot store one in a text column).
    """
    if not isinstance(value, str):
        return f"field {name} is not a string"
    if not value and not may_be_empty:
        return f"field {name} is empty"
    if len(value) > limit:
        return f"field {name} has {len(value)} characters; the limit is {limit}"
    if "\x00" in value:
        return f"field {name} contains a NUL character"
    return None


WORKER_NAME_CHARS = 64
"""A worker's name (``fiberflow node run --worker NAME``): ``node_workers.name``."""

SCHEDULE_ID_CHARS = 64
"""A schedule's name (``node_schedules.schedule_id``), checked where a schedule is made."""
SCHEDULE_SPEC_CHARS = 200
"""A schedule's time, interval or cron expression as stored (``node_schedules.spec``)."""
