"""``tests/unit/test_schedules.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_schedules

rerun(test_schedules, globals())
