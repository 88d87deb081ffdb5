"""``tests/unit/test_inbound_field_limits.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_inbound_field_limits

rerun(test_inbound_field_limits, globals())
