"""``tests/unit/test_continue_as_new.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_continue_as_new

rerun(test_continue_as_new, globals())
