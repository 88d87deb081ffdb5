"""The docs' example applications run as written: their code blocks are a real project.

A fenced block opened with ```` ```python file=PATH ```` in a doc is the file ``PATH`` of
that doc's example (blocks with the same path are joined in order; a package's directories
get an empty ``__init__.py`` unless the doc gives one). The test writes the files into
pytester's directory and runs pytest on them there, in a fresh interpreter (the doc's
``@serializable`` classes claim their names once per process), with fiberflow's installed
pytest plugin: the flows are real modules the nodes import as CorDapps, and the doc's tests
use the plugin's fixtures as a user's would. Each doc's files and its number of
passing tests are pinned, so a doc whose example breaks, loses a block or a test fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python file=(?P<path>\S+)[ \t]*\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)

EXAMPLES = {
    "writing-flows.md": (
        ["escrow/__init__.py", "escrow/agent.py", "escrow/deal.py", "escrow/seller.py"],
        ["test_escrow.py"],
        2,
    ),
    "crash-testing.md": ([], ["test_crashes.py"], 5),
    "getting-started.md": ([], ["test_ping.py"], 2),
}
"""Per doc: the files of its example that are not tests, its test files, its passing tests."""


def example_files(doc: Path) -> dict[str, str]:
    """The files the doc's marked blocks make, by relative path."""
    files: dict[str, str] = {}
    for match in BLOCK.finditer(doc.read_text()):
        path = match["path"]
        files[path] = files.get(path, "") + match["code"]
    return files


def test_blocks_are_found_in_a_doc_like_ours(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n\n```python file=app/a.py\nA = 1\n```\n\n```python\nnot = extracted\n```\n"
        "\n```python file=app/a.py\nB = 2\n```\n"
    )
    assert example_files(doc) == {"app/a.py": "A = 1\nB = 2\n"}


@pytest.mark.parametrize("doc_name", sorted(EXAMPLES))
def test_doc_example_runs(doc_name: str, pytester: pytest.Pytester) -> None:
    modules, tests, passed = EXAMPLES[doc_name]
    files = example_files(DOCS / doc_name)
    assert sorted(files) == sorted(modules + tests), f"{doc_name}: the example's files changed"
    for relative, code in files.items():
        target = pytester.path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code)
        for package in target.relative_to(pytester.path).parents:
            init = pytester.path / package / "__init__.py"
            if package != Path(".") and not init.exists():
                init.write_text("")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--strict-markers", "-W", "error", *tests
    )
    result.assert_outcomes(passed=passed)
