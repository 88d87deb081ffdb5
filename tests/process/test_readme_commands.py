"""The README's commands are the ones CI runs and the ones getting-started shows (issue 18).

``.ci/run`` takes the test and demo commands out of README.md (``.ci/readme-command``) and
runs them verbatim; docs/getting-started.md shows the same blocks. The test command works as
root (no ``sudo``) and as a user with ``sudo``, and falls back to ``apt-get update``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
CI_RUN = ROOT / ".ci" / "run"
EXTRACT = ROOT / ".ci" / "readme-command"


def block(path: Path, name: str) -> str:
    """The fenced block between ``<!-- command: NAME -->`` and ``<!-- end command -->``."""
    found = re.search(
        rf"^<!-- command: {name} -->\n```sh\n(.*?)\n```\n<!-- end command -->$",
        path.read_text(),
        re.DOTALL | re.MULTILINE,
    )
    assert found is not None, f"{path.name} has no '{name}' command block"
    return found.group(1)


def extracted(name: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EXTRACT), name, str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.parametrize("name", ["test", "demo"])
def test_ci_runs_exactly_the_readme_commands_and_getting_started_shows_them(name: str) -> None:
    readme = block(README, name)
    assert block(GETTING_STARTED, name) == readme  # the two documents cannot drift
    done = extracted(name, README)
    assert done.returncode == 0, done.stderr
    assert done.stdout == readme + "\n"  # what CI evaluates is the README's block, verbatim
    ci = CI_RUN.read_text()
    assert f"$(.ci/readme-command {name} README.md)" in ci
    assert f'eval "${name}_command"' in ci


def test_ci_has_no_test_command_of_its_own() -> None:
    """No pip install or pytest line in .ci/run besides the README's (they would drift)."""
    ci = CI_RUN.read_text()
    assert "pip install" not in ci and "pytest" not in ci and "apt-get" not in ci


def test_the_test_command_works_as_root_and_through_sudo_with_the_apt_update_fallback() -> None:
    command = block(README, "test")
    assert not re.search(r"(^|[^$])sudo apt-get", command)  # root has no sudo: chosen by id
    assert command.startswith('sudo=$([ "$(id -u)" -eq 0 ] || echo sudo)')
    packages = "libpostgresql-jdbc-java libxerial-sqlite-jdbc-java chromium chromium-driver"
    assert f"$sudo apt-get install -y -q {packages}" in command
    assert f"|| {{ $sudo apt-get update -q && $sudo apt-get install -y -q {packages}; }}" in (
        command.replace("\\\n  ", "")
    )
    assert ".venv/bin/pip install -q -e '.[dev,postgres,amqp,spark,metrics,rpc]'" in command
    assert command.rstrip().endswith(".venv/bin/python -m pytest")
    prefix = command.splitlines()[0].split("  #")[0]
    for user_id, expected in (("0", ""), ("1000", "sudo")):
        chosen = subprocess.run(
            ["sh", "-c", f'id() {{ echo {user_id}; }}; {prefix}; printf %s "$sudo"'],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert chosen.stdout == expected, chosen


def test_a_missing_block_is_an_error_naming_it() -> None:
    done = extracted("no-such-block", README)
    assert done.returncode == 2
    assert "no command block 'no-such-block' in" in done.stderr
