"""The checks' registry and docs/analytics.md's table of the checks say the same."""

from __future__ import annotations

import re
from pathlib import Path

from persistence.analytics.checks import CHECK_TITLES, CHECKS, REGISTRY

DOC = Path(__file__).resolve().parents[2] / "docs" / "analytics.md"


def documented_checks() -> list[tuple[str, str, str, bool]]:
    """(name, finds, worst verdict, needs a key) of each row of the doc's table of checks."""
    text = DOC.read_text()
    table = text[text.index("| check | finds | worst verdict | needs a key |") :]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        name, finds, worst, key = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((name.strip("`"), finds, worst, {"yes": True, "no": False}[key]))
    return rows


def test_the_doc_lists_every_check_as_registered() -> None:
    registered = [(c.name, c.finds, c.worst, c.needs_key) for c in REGISTRY]
    assert documented_checks() == registered


def test_what_runs_is_the_registry() -> None:
    assert [name for name, _ in CHECKS] == [c.name for c in REGISTRY]
    assert [run for _, run in CHECKS] == [c.run for c in REGISTRY]
    assert set(CHECK_TITLES) == {c.name for c in REGISTRY}
    assert all(c.worst in ("info", "warn", "fail") for c in REGISTRY)
    # each check in a module of its own, named after it (one module per check)
    modules = [c.run.__module__ for c in REGISTRY]
    assert modules == [f"persistence.analytics.checks.{c.name}" for c in REGISTRY]


def test_each_check_has_a_section_in_the_doc() -> None:
    headings = re.findall(r"^### `(\w+)`", DOC.read_text(), flags=re.MULTILINE)
    assert headings == [c.name for c in REGISTRY]
