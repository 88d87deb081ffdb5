"""The house rules: every framework module is small, and the import contracts hold.

The contracts are in ``pyproject.toml`` (``[tool.importlinter]``): the layers, the layers
inside ``flows``, a state machine without I/O, and no import cycle in any package.
``tests/process/test_import_contracts.py`` breaks each rule once and sees its contract fail.
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flows", "foundation", "statemachine", "messaging", "persistence")
MAX_LINES = 600


def test_no_framework_module_is_over_600_lines() -> None:
    too_big = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert too_big == {}, f"modules over {MAX_LINES} lines (split them along their seams)"


def test_the_import_contracts_hold() -> None:
    # (the use case, not the command: the command reconfigures logging for the whole process)
    from importlinter import configuration
    from importlinter.application import use_cases

    configuration.configure()
    printed = io.StringIO()
    with redirect_stdout(printed):
        kept = use_cases.lint_imports(
            config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True
        )
    assert kept, printed.getvalue()
