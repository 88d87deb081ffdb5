"""``tests/unit/test_limits.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_limits

rerun(test_limits, globals())
