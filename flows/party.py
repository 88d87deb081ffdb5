"""Parties: the identities of nodes, named by X.500-style names."""

from __future__ import annotations

import attrs

from foundation.serialization import PAYLOAD_TYPES
from statemachine.limits import PARTY_NAME_CHARS

_REQUIRED = ("O", "L", "C")
_ALLOWED = ("CN", "OU", "O", "L", "ST", "C")


def _check_name(_: object, __: object, name: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"a party name is a str, not {type(name).__name__}")
    if len(name) > PARTY_NAME_CHARS:
        raise ValueError(
            f"party name {name[:60]!r}... has {len(name)} characters; the limit is "
            f"{PARTY_NAME_CHARS}"
        )
    if "\x00" in name:
        raise ValueError(f"party name {name!r} contains a NUL character")
    parts: dict[str, str] = {}
    for item in name.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not value.strip():
            raise ValueError(f"party name {name!r}: {item.strip()!r} is not KEY=value")
        if key not in _ALLOWED:
            raise ValueError(f"party name {name!r}: unknown attribute {key!r} ({_ALLOWED})")
        if key in parts:
            raise ValueError(f"party name {name!r}: {key} given twice")
        parts[key] = value.strip()
    missing = [key for key in _REQUIRED if key not in parts]
    if missing:
        raise ValueError(
            f"party name {name!r} lacks {', '.join(missing)} "
            "(write it like 'O=Alice,L=London,C=GB')"
        )


@PAYLOAD_TYPES.register
@attrs.frozen(order=True)
class Party:
    """A node's identity, e.g. ``Party("O=Alice,L=London,C=GB")``.

    The name is at most ``limits.PARTY_NAME_CHARS`` characters (it is the node's address and
    the sender of its messages), without NUL characters.
    """

    name: str = attrs.field(validator=_check_name)

    @property
    def organisation(self) -> str:
        """The ``O=`` part of the name."""
        for item in self.name.split(","):
            key, _, value = item.strip().partition("=")
            if key == "O":
                return value.strip()
        raise AssertionError("validated names have an O= part")

    def __str__(self) -> str:
        return self.name
