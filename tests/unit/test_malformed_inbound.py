"""Malformed and hostile inbound messages are dead-lettered; the node keeps serving.

CI runs ``FIBERFLOW_MALFORMED_EXAMPLES`` hypothesis examples (default 60), each a list of up to
15 inputs; ``python -m tests.malformed_campaign`` runs 10,000 and more.
"""

from __future__ import annotations

import os

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foundation.serialization import Serializer
from messaging.codec import WIRE_TYPES
from statemachine import session_messages
from tests.malformed import Injection, inbound_garbage, survives

EXAMPLES = int(os.environ.get("FIBERFLOW_MALFORMED_EXAMPLES", "60"))
LOOSE = Serializer(WIRE_TYPES, "garbage")


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(inbound_garbage(), min_size=1, max_size=15))
def test_the_node_survives_any_inbound_garbage(injections: list[Injection]) -> None:
    survives(injections)


def frame(data: bytes, message_id: str = "N-x.s0-1") -> Injection:
    return Injection(None, message_id, "O=Alice,L=London,C=GB", data)


def existing(session: str, sequence: object, body: object) -> bytes:
    return LOOSE.encode(session_messages.ExistingSessionMessage(session, sequence, body))  # type: ignore[arg-type]


def test_each_kind_of_bad_input_is_counted_where_it_is_refused() -> None:
    end = session_messages.SessionEnd()
    stats = survives(
        [
            Injection(raw=b"\x00 not a frame"),
            frame(b"\xc1 garbage"),
            frame(msgpack.packb([1, 2, 3])),
            frame(existing("x.s0.r", "one", end)),  # wrong field type
            frame(existing("x.s0.r", -1, end)),  # sequence out of range
            frame(existing("LIVE", 1, end), message_id="N-wrong-1"),  # id does not match
            frame(existing(f"{'a' * 32}.s0.r", 1, end), message_id=f"N-{'a' * 32}.s0-1"),
        ]
    )
    assert stats["transport_dead_letters"] == 1
    # Five refused at once; the last is well formed but for a session whose initial
    # message never comes: it waits (bounded) and is dead-lettered after the timeout.
    assert stats["node_dead_letters"] == 6
