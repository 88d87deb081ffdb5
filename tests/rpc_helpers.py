"""Users, hashes and configs shared by the RPC tests (hashing is slow: done once)."""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any

from flows.rpc.hashing import hash_secret

PASSWORDS = {
    "starter": "starter-password",
    "watcher": "watcher-password",
    "operator": "operator-password",
    "nobody": "nobody-password",
    "everything": "everything-password",
}
TOKEN = "fft_the-token-of-the-robot-user-0123456789"


@functools.cache
def hashed(secret: str) -> str:
    return hash_secret(secret)


def users_table() -> list[dict[str, Any]]:
    """The users the RPC tests log in as."""
    return [
        {
            "name": "starter",
            "password_hash": hashed(PASSWORDS["starter"]),
            "start": ["samples.pingpong.flows.PingFlow", "tests.rpc_cordapp.StepsFlow"],
        },
        {"name": "watcher", "password_hash": hashed(PASSWORDS["watcher"]), "observe": True},
        {"name": "operator", "password_hash": hashed(PASSWORDS["operator"]), "operate": True},
        {"name": "nobody", "password_hash": hashed(PASSWORDS["nobody"])},
        {
            "name": "everything",
            "password_hash": hashed(PASSWORDS["everything"]),
            "start": ["*"],
            "observe": True,
            "operate": True,
        },
        {"name": "robot", "token_hash": hashed(TOKEN), "start": ["*"], "observe": True},
    ]


def basic(user: str, password: str | None = None) -> dict[str, str]:
    """The Authorization header of ``user`` (with its password unless another is given)."""
    secret = PASSWORDS[user] if password is None else password
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()}


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def toml_document(fields: dict[str, Any], rpc: dict[str, Any] | None) -> str:
    """A node config in TOML: ``fields`` and an ``[rpc]`` section with its users."""
    import json

    def value(item: Any) -> str:
        if isinstance(item, dict):
            return "{ " + ", ".join(f"{k} = {value(v)}" for k, v in item.items()) + " }"
        if isinstance(item, bool):
            return "true" if item else "false"
        return json.dumps(item)

    lines = [f"{key} = {value(item)}" for key, item in fields.items()]
    if rpc is not None:
        section = dict(rpc)
        users = section.pop("users", [])
        lines.append("[rpc]")
        lines += [f"{key} = {value(item)}" for key, item in section.items()]
        for user in users:
            lines.append("[[rpc.users]]")
            lines += [f"{key} = {value(item)}" for key, item in user.items()]
    return "\n".join(lines) + "\n"


def write_node_config(path: Path, fields: dict[str, Any], rpc: dict[str, Any] | None) -> Path:
    path.write_text(toml_document(fields, rpc))
    return path
