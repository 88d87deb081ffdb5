"""``tests/unit/test_hibernation.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_hibernation

rerun(test_hibernation, globals())
