"""``tests/unit/test_inflight_duplicates.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_inflight_duplicates

rerun(test_inflight_duplicates, globals())
