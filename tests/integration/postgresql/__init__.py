"""The unit tier's network tests again, with every node on PostgreSQL.

Each module here collects one module of ``tests/unit`` again (:func:`rerun`); its
``conftest.py`` makes ``backend`` PostgreSQL and keeps only the tests that use it, so every
test written against ``backend`` (or the ``net`` fixture) in the unit tier runs on both
databases in CI without a service in the fast loop.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


def rerun(module: ModuleType, namespace: dict[str, Any]) -> None:
    """Collect ``module``'s tests (with its fixtures and marks) in ``namespace`` too."""
    namespace.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
