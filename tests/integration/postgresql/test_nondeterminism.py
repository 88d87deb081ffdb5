"""``tests/unit/test_nondeterminism.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_nondeterminism

rerun(test_nondeterminism, globals())
