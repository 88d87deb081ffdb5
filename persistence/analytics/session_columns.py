"""The session-id grammar of :mod:`statemachine.session_ids` as Spark column expressions.

The checks run as Spark SQL only (no Python UDF, so a cluster's executors need no
fiberflow), so they cannot call the Python functions row by row. Each expression here
restates one of them, built from that module's constants (the responder suffix, the session
separator, the message-id prefix, the tag length, the UUID-5 namespace), and
``tests/analytics/test_analytics.py`` holds each to agree with its Python function on the
session ids real nodes wrote, tagged and untagged:

================================  ==================================================
Spark expression                  Python function (``statemachine.session_ids``)
================================  ==================================================
:func:`is_responder`              ``is_responder_session_id``
:func:`peer_session`              ``peer_session_id``
:func:`session_flow`              ``flow_id_of_session``
:func:`expected_message_id`       ``message_id``
:func:`message_session`           the inverse of ``message_id`` (its sender session)
:func:`responder_flow_id`         ``responder_flow_id``
================================  ==================================================

PySpark is imported inside each function, so this module imports without it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from statemachine.session_ids import (
    MESSAGE_ID_PREFIX,
    RESPONDER_NAMESPACE,
    RESPONDER_SUFFIX,
    SESSION_SEPARATOR,
    TAG_LENGTH,
)

if TYPE_CHECKING:
    from pyspark.sql import Column

SESSION_FLOW_PATTERN = rf"^(?:[0-9a-f]{{{TAG_LENGTH}}}-)?(.+){re.escape(SESSION_SEPARATOR)}[0-9]+$"
"""An initiator session id: an optional identity tag of the initiating node (``TAG_LENGTH``
hex digits) and a dash, the initiating flow's id, ``SESSION_SEPARATOR`` and the session's
index (both the untagged ``F.s0`` and the tagged ``<tag>-F.s0`` forms)."""

MESSAGE_ID_PATTERN = rf"^{re.escape(MESSAGE_ID_PREFIX)}(.+)-([0-9]+)$"
"""A session message id: ``MESSAGE_ID_PREFIX``, the sender's session id, a dash and the
sequence number (groups 1 and 2)."""


def is_responder(session: Column) -> Column:
    """True for the responder's side of a session (it ends with ``RESPONDER_SUFFIX``)."""
    return session.endswith(RESPONDER_SUFFIX)


def _without_suffix(session: Column) -> Column:
    from pyspark.sql import functions as F

    return session.substr(F.lit(1), F.length(session) - len(RESPONDER_SUFFIX))


def initiator_session(session: Column) -> Column:
    """The initiator's id of a session (``X.r`` -> ``X``; ``X`` stays)."""
    from pyspark.sql import functions as F

    return F.when(is_responder(session), _without_suffix(session)).otherwise(session)


def conversation_key(session: Column) -> Column:
    """A 64-bit key shared by both ends of a session: ``xxhash64`` of its initiator's id."""
    from pyspark.sql import functions as F

    return F.xxhash64(initiator_session(session))


def peer_session(session: Column) -> Column:
    """The other end's session id (``X`` <-> ``X.r``)."""
    from pyspark.sql import functions as F

    return F.when(is_responder(session), _without_suffix(session)).otherwise(
        F.concat(session, F.lit(RESPONDER_SUFFIX))
    )


def session_flow(session: Column) -> Column:
    """The id of the initiating flow of a session (``F.s3``, ``F.s3.r``, ``T-F.s3`` -> ``F``).

    The empty string for an id that is not a session id of the grammar.
    """
    from pyspark.sql import functions as F

    return F.regexp_extract(initiator_session(session), SESSION_FLOW_PATTERN, 1)


def expected_message_id(sender_session: Column, sequence: Column) -> Column:
    """The id of message ``sequence`` sent from ``sender_session``: ``N-<session>-<sequence>``."""
    from pyspark.sql import functions as F

    return F.concat(F.lit(MESSAGE_ID_PREFIX), sender_session, F.lit("-"), sequence.cast("string"))


def message_session(message_id: Column) -> Column:
    """The sender's session id of a session message id (the empty string for another id)."""
    from pyspark.sql import functions as F

    return F.regexp_extract(message_id, MESSAGE_ID_PATTERN, 1)


def message_sequence(message_id: Column) -> Column:
    """The sequence number at the end of a message id (``bigint``; null when there is none)."""
    from pyspark.sql import functions as F

    return F.regexp_extract(message_id, r"-([0-9]+)$", 1).cast("bigint")


def responder_flow_id(initiator_node: Column, session: Column) -> Column:
    """The responder flow's id on the peer: UUID5 of ``"<initiator node>|<session>"``.

    Computed in Spark SQL (SHA-1 of ``RESPONDER_NAMESPACE`` and the name, version and
    variant bits set), the same id ``statemachine.session_ids.responder_flow_id`` gives the
    responder a node starts.
    """
    from pyspark.sql import functions as F

    name = F.concat(initiator_node, F.lit("|"), session)
    digest = F.sha1(F.concat(F.unhex(F.lit(RESPONDER_NAMESPACE.hex)), F.encode(name, "UTF-8")))
    variant_nibble = F.conv(F.substring(digest, 17, 1), 16, 10).cast("int")
    # the variant digit, 8, 9, a or b, picked from a literal: ``lower(hex(...))`` would run
    # Spark's collation-aware lower case, whose first use loads ICU (a second of a task)
    variant = F.element_at(
        F.array(*[F.lit(digit) for digit in "89ab"]), variant_nibble.bitwiseAND(3) + 1
    )
    return F.concat(
        F.substring(digest, 1, 12),
        F.lit("5"),
        F.substring(digest, 14, 3),
        variant,
        F.substring(digest, 18, 15),
    )


def counterpart_flow(node: Column, session: Column) -> Column:
    """The flow that holds the other end of ``session`` (seen on ``node``), on the peer.

    The initiating flow for a responder end; the responder flow ``node`` started the
    session with (:func:`responder_flow_id`) for an initiator end.
    """
    from pyspark.sql import functions as F

    return F.when(is_responder(session), session_flow(session)).otherwise(
        responder_flow_id(node, session)
    )
