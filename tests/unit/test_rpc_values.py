"""JSON arguments converted by constructor annotations, and results made JSON-able."""

from __future__ import annotations

import json
from typing import Any, Optional

import attrs
import pytest

from flows import FlowLogic, Party
from flows.rpc.arguments import ArgumentError, build_flow, convert
from flows.rpc.outcomes import json_value


@pytest.mark.parametrize(
    ("value", "annotation", "expected"),
    [
        ("O=Bob,L=New York,C=US", Party, Party("O=Bob,L=New York,C=US")),
        (3, float, 3.0),
        ([1, "a"], tuple[int, str], (1, "a")),
        ([1, 2], tuple[int, ...], (1, 2)),
        ({"a": [1]}, dict[str, list[int]], {"a": [1]}),
        (None, Optional[int], None),  # noqa: UP045 (the old spelling is supported too)
        (5, int | None, 5),
        ("x", int | str, "x"),
        ({"any": [None, True]}, Any, {"any": [None, True]}),
        (["O=A,L=B,C=GB"], list[Party], [Party("O=A,L=B,C=GB")]),
    ],
)
def test_json_values_become_what_the_annotation_says(
    value: Any, annotation: Any, expected: Any
) -> None:
    converted = convert(value, annotation, "x")
    assert converted == expected and type(converted) is type(expected)


@pytest.mark.parametrize(
    ("value", "annotation", "message"),
    [
        (True, int, "argument 'x': must be an integer, not a boolean"),
        ("1", int, "argument 'x': must be an integer, not a string"),
        ([1, 2, 3], tuple[int, int], "argument 'x': needs 2 items, not 3"),
        ({"a": "b"}, dict[str, int], "argument \"x['a']\": must be an integer"),
        ({}, dict[int, str], "only dicts with string keys"),
        (1.5, int | None, "argument 'x': a number is none of int or NoneType"),
        ("", Party, "argument 'x': not a party's name"),
        (1, bytes, "argument 'x': its type bytes cannot be given over the API"),
    ],
)
def test_values_of_the_wrong_type_are_refused_naming_the_argument(
    value: Any, annotation: Any, message: str
) -> None:
    with pytest.raises(ArgumentError) as caught:
        convert(value, annotation, "x")
    assert message in str(caught.value)


class PositionalFlow(FlowLogic[None]):
    def __init__(self, *names: str) -> None:
        self.names = names

    def call(self) -> None:
        return None


def test_a_constructor_taking_star_args_cannot_be_built() -> None:
    with pytest.raises(ArgumentError, match="positional-only or \\*args"):
        build_flow(PositionalFlow, {})


@attrs.frozen
class Point:
    x: int
    y: int


def test_results_become_json() -> None:
    result = {
        "party": Party("O=A,L=B,C=GB"),
        "point": Point(1, 2),
        "pair": (1, b"\x00"),
        "odd": float("nan"),
        "other": {1: object},
    }
    converted = json_value(result)
    json.dumps(converted, allow_nan=False)  # it is JSON
    assert converted["party"] == "O=A,L=B,C=GB"
    assert converted["point"] == {"type": "Point", "x": 1, "y": 2}
    assert converted["pair"] == [1, {"bytes_base64": "AA=="}]
    assert converted["odd"] == "nan"
    assert converted["other"] == {"1": "<class 'object'>"}
