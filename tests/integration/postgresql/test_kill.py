"""``tests/unit/test_kill.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_kill

rerun(test_kill, globals())
