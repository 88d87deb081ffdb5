"""``UntrustworthyData``: what a receive returns, to be checked before it is used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class UntrustworthyData(Generic[T]):
    """A value received from a counterparty. Call :meth:`unwrap` with a validator to use it.

    The counterparty may be malicious or buggy: the validator is where a flow checks that the
    value makes sense before acting on it (raise ``FlowException`` if it does not).
    """

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def unwrap(self, validator: Callable[[T], R]) -> R:
        """Pass the received value through ``validator`` and return what it returns."""
        return validator(self._value)

    def __repr__(self) -> str:
        return f"UntrustworthyData({type(self._value).__name__})"
