"""``tests/unit/test_timeouts.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_timeouts

rerun(test_timeouts, globals())
