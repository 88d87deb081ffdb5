"""Each import contract of ``pyproject.toml`` fails when the rule it states is broken.

The packages are copied aside, one import that breaks a rule is added to the copy, and
``lint-imports`` runs on the copy in a child interpreter (the editable install's finder taken
out, so that the copy is what it reads): the contract stating that rule must be broken.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flows", "foundation", "statemachine", "messaging", "persistence")

LINT_THE_COPY = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("__editable")]
sys.path.insert(0, ".")
from importlinter.cli import lint_imports
sys.exit(lint_imports(config_filename="pyproject.toml", no_cache=True))
"""

BROKEN_RULES = [
    # (the module given one more import, the import, the contract it breaks)
    (
        "persistence/store.py",
        "import messaging.codec",
        "flows on top, messaging and persistence independent below it",
    ),
    ("foundation/bounded.py", "import persistence.schema", "then foundation"),
    ("statemachine/transition.py", "import threading", "statemachine does no I/O"),
    ("statemachine/limits.py", "import flows.party", "statemachine at the bottom"),
    ("flows/network/doorman.py", "import flows.rpc.hashing", "inside flows"),
    ("flows/errors.py", "import flows.node.busy", "inside flows"),
    (
        "statemachine/session_ids.py",
        "import statemachine.transition",
        "no import cycle between the modules and subpackages of any package",
    ),
]


def copy_of_the_packages(directory: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, directory / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", directory / "pyproject.toml")
    return directory


def lint(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LINT_THE_COPY],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_copy_of_the_packages_keeps_every_contract(tmp_path: Path) -> None:
    done = lint(copy_of_the_packages(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "BROKEN" not in done.stdout


@pytest.mark.parametrize(("module", "line", "contract"), BROKEN_RULES)
def test_a_broken_rule_breaks_its_contract(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    copy = copy_of_the_packages(tmp_path)
    path = copy / module
    path.write_text(path.read_text() + f"\n{line}  # the rule broken on purpose\n")
    done = lint(copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert verdicts(done.stdout)[contract] == "BROKEN", done.stdout


def verdicts(output: str) -> dict[str, str]:
    """Each contract's verdict (KEPT or BROKEN), keyed by every rule of BROKEN_RULES it has."""
    summary = " ".join(output.split()).split("Analyzed")[1].split("Contracts:")[0]
    summary = summary.split("dependencies.", 1)[1]
    found = re.findall(r"(.+?) (KEPT|BROKEN)", summary)
    named = {name.strip(" -"): verdict for name, verdict in found}
    return {
        rule: verdict
        for _, _, rule in BROKEN_RULES
        for name, verdict in named.items()
        if rule in name
    }
