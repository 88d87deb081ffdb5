"""``tests/unit/test_restart_everywhere.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_restart_everywhere

rerun(test_restart_everywhere, globals())
