"""The payload allow-list: what may cross, what is refused, what is never constructed."""

from __future__ import annotations

import contextlib

import attrs
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows import FlowArgumentError, Party
from flows.node.flow_requests import encode_arguments
from foundation.serialization import (
    EXT_OBJECT,
    PAYLOAD_TYPES,
    PAYLOADS,
    SerializationError,
    SerializationLimits,
    Serializer,
)
from persistence.checkpoint_codec import decode_checkpoint, encode_checkpoint
from samples.pingpong import PingFlow
from samples.trade import TradeProposal

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda children: (
        st.lists(children)
        | st.tuples(children, children)
        | st.dictionaries(st.text() | st.integers(), children)
    ),
    max_leaves=20,
)


@given(plain)
def test_plain_values_round_trip_with_their_exact_types(value: object) -> None:
    assert PAYLOADS.decode(PAYLOADS.encode(value)) == value
    again = PAYLOADS.decode(PAYLOADS.encode(value))
    assert type(again) is type(value)


def test_integers_of_any_size_round_trip() -> None:
    for value in (2**64, 2**64 - 1, -(2**63) - 1, 10**40, -(10**40)):
        assert PAYLOADS.decode(PAYLOADS.encode(value)) == value


def test_registered_classes_round_trip() -> None:
    alice, bob = Party("O=Alice,L=London,C=GB"), Party("O=Bob,L=Paris,C=FR")
    proposal = TradeProposal("tea", 3, 120, alice, bob)
    assert PAYLOADS.decode(PAYLOADS.encode([proposal, (alice,)])) == [proposal, (alice,)]


def test_unregistered_types_are_refused_at_encoding_naming_where() -> None:
    @attrs.frozen
    class Secret:
        value: int

    with pytest.raises(SerializationError, match=r"value\[1\]\['k'\] is a .*Secret"):
        PAYLOADS.encode([1, {"k": Secret(3)}])
    with pytest.raises(SerializationError, match="set"):
        PAYLOADS.encode({1, 2})


def test_decoding_never_constructs_an_unregistered_type() -> None:
    body = msgpack.packb(["os.system", ["echo pwned"]], use_bin_type=True)
    data = msgpack.packb(msgpack.ExtType(EXT_OBJECT, body), use_bin_type=True)
    with pytest.raises(SerializationError, match="'os.system' is not registered"):
        PAYLOADS.decode(data)


@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_another_exception(data: bytes) -> None:
    with contextlib.suppress(SerializationError):
        PAYLOADS.decode(data)


def test_deep_nesting_is_refused() -> None:
    value: list[object] = []
    for _ in range(100):
        value = [value]
    with pytest.raises(SerializationError, match="deeper than"):
        PAYLOADS.encode(value)


def test_flow_arguments_must_be_serializable_naming_the_argument() -> None:
    flow = PingFlow(object())  # type: ignore[arg-type]
    with pytest.raises(FlowArgumentError, match="PingFlow: argument 1 cannot be checkpointed"):
        encode_arguments(flow)


def test_checkpoint_blob_of_another_kind_is_refused() -> None:
    with pytest.raises(SerializationError, match="not a checkpoint"):
        decode_checkpoint(PAYLOADS.encode([1, "x"]))
    with pytest.raises(SerializationError):
        decode_checkpoint(b"\xc1garbage")


def test_checkpoint_round_trip() -> None:
    from statemachine import transition
    from statemachine.events import StartFlow, Suspend
    from statemachine.iorequests import InitiateSession, Receive
    from statemachine.state import StartedLocally

    state = transition(None, StartFlow("f", StartedLocally("a.B", b""), 1.0)).state
    state = transition(state, Suspend(InitiateSession("O=X,L=Y,C=ZZ", "a.B", 1, "a"), 1.0)).state
    state = transition(state, Suspend(Receive(("f.s0",)), 2.0)).state
    assert decode_checkpoint(encode_checkpoint(state.checkpoint)) == state.checkpoint


def test_party_names_are_validated() -> None:
    with pytest.raises(ValueError, match="lacks L, C"):
        Party("O=Alice")
    with pytest.raises(ValueError, match="unknown attribute 'X'"):
        Party("O=Alice,L=London,C=GB,X=1")


LIMITS = SerializationLimits(
    max_bytes=10_000,
    max_depth=8,
    max_collection_length=50,
    max_string_length=100,
    max_bytes_length=200,
)


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("x" * 101, "max_string_length"),
        (b"x" * 201, "max_bytes_length"),
        (list(range(51)), "max_collection_length"),
        (tuple(range(51)), "max_collection_length"),
        ({i: i for i in range(51)}, "max_collection_length"),
        ([[[[[[[[[[1]]]]]]]]]], "max_depth"),
        ([["y" * 100] * 45] * 3, "max_bytes"),
    ],
)
def test_a_value_over_a_limit_is_refused_both_ways_naming_the_rule(
    value: object, rule: str
) -> None:
    strict = Serializer(PAYLOAD_TYPES, "payload", LIMITS)
    with pytest.raises(SerializationError, match=f"breaks the rule {rule}"):
        strict.encode(value)
    data = PAYLOADS.encode(value)  # made by a sender with the default (wider) limits
    with pytest.raises(SerializationError, match=f"breaks the rule {rule}"):
        strict.decode(data)


def test_values_within_the_limits_round_trip() -> None:
    strict = Serializer(PAYLOAD_TYPES, "payload", LIMITS)
    value = {"name": "x" * 100, "blob": b"y" * 200, "items": list(range(50))}
    assert strict.decode(strict.encode(value)) == value


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_depth must be a positive int"):
        SerializationLimits(max_depth=0)
