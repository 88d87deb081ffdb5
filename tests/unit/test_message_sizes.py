"""Sizes at the edge: a payload too large for a session message fails its flow before
anything is sent (never the node), and an error message of any length crosses, cut short."""

from __future__ import annotations

import re

import pytest

from flows import FlowException
from flows.testing import MockNetwork
from foundation.serialization import SerializationError, SerializationLimits
from messaging.codec import ENVELOPE_HEADROOM, max_payload_bytes
from samples.pingpong import PingFlow
from statemachine.flow_error import MAX_ERROR_MESSAGE_CHARS
from tests.cordapp import BlobFlow
from tests.helpers import assert_drained

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


def test_the_largest_payload_crosses_and_one_byte_more_fails_only_its_flow(
    net: MockNetwork,
) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    # The payload is [blob, 0]: a few bytes of msgpack around the blob.
    overhead = 16
    fits = alice.start_flow(BlobFlow(bob.party, max_payload_bytes() - overhead))
    too_big = alice.start_flow(BlobFlow(bob.party, max_payload_bytes() + 1))
    ping = alice.start_flow(PingFlow(bob.party))
    net.run_network()
    assert fits.result() == max_payload_bytes() - overhead
    with pytest.raises(SerializationError, match="max_payload_bytes") as caught:
        too_big.result()
    assert f"less {ENVELOPE_HEADROOM} bytes for the envelope" in str(caught.value)
    assert ping.result() == "Pong"
    assert bob.node.manager.statistics.flows_started == 2  # the blob that fits, and the ping
    assert_drained(net)


def test_a_huge_error_message_reaches_the_counterparty_cut_short(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    handle = alice.start_flow(BlobFlow(bob.party, 10, error_chars=20 * 1024 * 1024))
    net.run_network()
    with pytest.raises(FlowException) as caught:
        handle.result()
    message = str(caught.value)
    assert message.startswith("e" * 100)
    assert len(message) <= MAX_ERROR_MESSAGE_CHARS
    assert re.search(r"e\.\.\. \(\d{8} more characters cut\)$", message), message[-80:]
    assert_drained(net)


def test_each_node_has_its_own_limits_in_one_process(net: MockNetwork) -> None:
    small = SerializationLimits(max_bytes=256 * 1024, max_bytes_length=256 * 1024)
    alice = net.create_node(ALICE, limits=small)
    bob = net.create_node(BOB)
    assert alice.node.codec.max_payload_bytes == 256 * 1024 - ENVELOPE_HEADROOM
    assert bob.node.codec.max_payload_bytes == max_payload_bytes()
    size = 200 * 1024  # over Alice's payload limit, well within Bob's
    from_bob = bob.start_flow(BlobFlow(alice.party, size))
    from_alice = alice.start_flow(BlobFlow(bob.party, size))
    net.run_network()
    assert from_bob.result() == size  # Alice takes in what her limits allow
    with pytest.raises(SerializationError, match=f"at most {256 * 1024 - ENVELOPE_HEADROOM} "):
        from_alice.result()
    assert max_payload_bytes() == bob.node.codec.max_payload_bytes  # nothing changed globally
    assert_drained(net)
