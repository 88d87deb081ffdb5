"""The [rpc] config section, fiberflow rpc hash-password/new-token, and authentication."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flows.config.rpc import RpcConfig, RpcUser
from flows.config.runtime import ConfigError, load_config
from flows.rpc.auth import AuthenticationError, Authenticator
from flows.rpc.hashing import hash_secret
from tests.rpc_helpers import (
    PASSWORDS,
    TOKEN,
    basic,
    bearer,
    hashed,
    users_table,
    write_node_config,
)

FIBERFLOW = [sys.executable, "-m", "flows.cli"]


def fields() -> dict[str, Any]:
    return {
        "name": "O=Alice,L=London,C=GB",
        "database_url": "sqlite:///alice.db",
        "transport_url": "sqlite:///queue.db",
        "cordapps": ["samples.pingpong", "tests.rpc_cordapp"],
    }


def test_a_config_without_rpc_serves_no_api(tmp_path: Path) -> None:
    assert load_config(write_node_config(tmp_path / "n.toml", fields(), None)).rpc is None


def test_the_rpc_section_and_its_users_are_read(tmp_path: Path) -> None:
    rpc = {"port": 8080, "tls_certificate": "c.pem", "tls_key": "k.pem", "users": users_table()}
    config = load_config(write_node_config(tmp_path / "n.toml", fields(), rpc)).rpc
    assert config is not None
    assert (config.address, config.port, config.max_body_bytes) == ("127.0.0.1", 8080, 65536)
    assert config.tls_certificate == tmp_path / "c.pem" and config.tls
    users = {user.name: user for user in config.users}
    assert users["starter"].may_start("samples.pingpong.flows.PingFlow")
    assert not users["starter"].may_start("tests.rpc_cordapp.TypedFlow")
    assert users["everything"].may_start("tests.rpc_cordapp.TypedFlow")
    assert (users["watcher"].observe, users["watcher"].operate) == (True, False)
    assert users["robot"].token_hash is not None and users["robot"].password_hash is None


USER = {"name": "u", "password_hash": hashed("x")}


@pytest.mark.parametrize(
    ("rpc", "message"),
    [
        ({"address": "0.0.0.0", "port": 1}, "field 'rpc.address': 0.0.0.0 is not a loopback"),
        ({"address": "10.1.2.3", "port": 1, "tls_key": "k"}, "'rpc.tls_certificate': missing"),
        ({"port": 1, "colour": "red"}, "field 'rpc.colour': unknown field"),
        ({"address": "127.0.0.1"}, "field 'rpc.port': missing"),
        ({"port": 70000}, "field 'rpc.port': must be 0 to 65535"),
        ({"port": "80"}, "field 'rpc.port': must be a int"),
        ({"port": 1, "max_body_bytes": 10}, "field 'rpc.max_body_bytes': must be at least 1024"),
        ({"port": 1, "users": [{"name": "u"}]}, "exactly one of password_hash and token_hash"),
        (
            {"port": 1, "users": [{"name": "u", "password_hash": "plain"}]},
            "field 'rpc.users[u].password_hash': not an argon2 hash",
        ),
        ({"port": 1, "users": [USER, USER]}, "user 'u' is listed twice"),
        (
            {"port": 1, "users": [{**USER, "start": ["samples.pingpong.flows.PongFlow"]}]},
            "PongFlow is not marked @startable_by_rpc",
        ),
        (
            {"port": 1, "users": [{**USER, "start": ["samples.pingpong.flows.Nope"]}]},
            "Nope is not a flow in cordapps",
        ),
        ({"port": 1, "users": [{**USER, "observe": "yes"}]}, "observe': must be a bool"),
    ],
)
def test_a_bad_rpc_section_fails_naming_the_field(
    tmp_path: Path, rpc: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match="n.toml: field 'rpc") as caught:
        load_config(write_node_config(tmp_path / "n.toml", fields(), rpc))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_plain_http_on_a_non_loopback_address_needs_saying_so(tmp_path: Path) -> None:
    rpc = {"address": "0.0.0.0", "port": 1, "allow_plain_non_loopback": True}
    config = load_config(write_node_config(tmp_path / "n.toml", fields(), rpc)).rpc
    assert config is not None and config.address == "0.0.0.0" and not config.tls
    with_tls = {"address": "0.0.0.0", "port": 1, "tls_certificate": "c", "tls_key": "k"}
    assert load_config(write_node_config(tmp_path / "t.toml", fields(), with_tls)).rpc


def test_several_workers_must_say_which_serve() -> None:
    config = RpcConfig(port=8080)
    assert config.port_for(None) == 8080 and config.worker_problem(None) is None
    assert "rpc.worker_ports" in str(config.worker_problem("w1"))
    named = RpcConfig(port=8080, worker_ports={"w1": 8081})
    assert named.worker_problem("w2") is None
    assert (named.port_for("w1"), named.port_for("w2")) == (8081, None)


def test_node_run_refuses_a_bad_rpc_section_in_one_line(tmp_path: Path) -> None:
    path = write_node_config(tmp_path / "n.toml", fields(), {"address": "0.0.0.0", "port": 1})
    done = subprocess.run(
        [*FIBERFLOW, "node", "run", "--config", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "field 'rpc.address'" in done.stderr


def test_hash_password_reads_stdin_and_the_hash_verifies() -> None:
    done = subprocess.run(
        [*FIBERFLOW, "rpc", "hash-password"], input="s3cret\n", capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    encoded = done.stdout.strip()
    user = RpcUser("u", password_hash=encoded, observe=True)
    assert Authenticator((user,)).user_for(_basic_header("u", "s3cret")) == user
    empty = subprocess.run(
        [*FIBERFLOW, "rpc", "hash-password"], input="\n", capture_output=True, text=True
    )
    assert empty.returncode == 2 and empty.stderr.strip() == (
        "fiberflow rpc hash-password: the password is empty"
    )


def test_new_token_prints_a_token_and_its_hash() -> None:
    done = subprocess.run([*FIBERFLOW, "rpc", "new-token"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" = ", 1) for line in done.stdout.splitlines() if " = " in line)
    token, encoded = lines["token"], lines["token_hash"].strip('"')
    assert token.startswith("fft_") and len(token) > 40
    user = RpcUser("robot", token_hash=encoded)
    assert Authenticator((user,)).user_for(f"Bearer {token}") == user


def _basic_header(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def authenticator() -> Authenticator:
    users = tuple(
        RpcUser(u["name"], password_hash=u.get("password_hash"), token_hash=u.get("token_hash"))
        for u in users_table()
    )
    return Authenticator(users)


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (None, "credentials needed"),
        ("", "credentials needed"),
        (basic("watcher", "wrong")["Authorization"], "wrong user name, password or token"),
        (_basic_header("ghost", "x"), "wrong user name, password or token"),
        (bearer("fft_not-a-token")["Authorization"], "wrong user name, password or token"),
        ("Basic !!!", "malformed Basic credentials"),
        ("Basic " + "bm9jb2xvbg==", "malformed Basic credentials"),  # "nocolon"
        ("Digest abc", "unsupported authorization scheme"),
        # a token user's token is not a password, and a password is not a token
        (_basic_header("robot", TOKEN), "wrong user name, password or token"),
        (bearer(PASSWORDS["watcher"])["Authorization"], "wrong user name, password or token"),
    ],
)
def test_bad_credentials_are_refused(
    authenticator: Authenticator, header: str | None, problem: str
) -> None:
    with pytest.raises(AuthenticationError, match=problem):
        authenticator.user_for(header)


def test_good_credentials_name_their_user(authenticator: Authenticator) -> None:
    assert authenticator.user_for(basic("watcher")["Authorization"]).name == "watcher"
    assert authenticator.user_for(bearer()["Authorization"]).name == "robot"


def test_a_verification_is_remembered_for_a_while_and_a_failure_never() -> None:
    now = [0.0]
    user = RpcUser("u", password_hash=hash_secret("pw"))
    authenticator = Authenticator((user,), clock=lambda: now[0])
    calls: list[str] = []
    original = authenticator._password_user

    def counting(name: str, password: str) -> RpcUser | None:
        calls.append(password)
        return original(name, password)

    authenticator._password_user = counting  # type: ignore[method-assign]
    good, bad = _basic_header("u", "pw"), _basic_header("u", "nope")
    for _ in range(3):
        assert authenticator.user_for(good) == user
        with pytest.raises(AuthenticationError):
            authenticator.user_for(bad)
    assert calls == ["pw", "nope", "nope", "nope"]
    now[0] = 61.0  # past CACHE_SECONDS: verified again
    assert authenticator.user_for(good) == user
    assert calls[-1] == "pw" and len(calls) == 5


def test_a_node_without_rpc_never_loads_the_rpc_stack(tmp_path: Path) -> None:
    """Reading a config and building a node process loads no Starlette, uvicorn or argon2."""
    path = write_node_config(tmp_path / "n.toml", fields(), None)
    probe = (
        "import json, sys\n"
        "from flows.config.runtime import load_config\n"
        "from flows.process.process import NodeProcess\n"
        f"NodeProcess(load_config({str(path)!r}))\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True
    )
    loaded = {name.split(".")[0] for name in json.loads(done.stdout)}
    assert sorted(loaded & {"starlette", "uvicorn", "argon2", "httpx", "anyio"}) == []
