"""``tests/unit/test_quarantine.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_quarantine

rerun(test_quarantine, globals())
