"""``tests/unit/test_delivery_faults.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_delivery_faults

rerun(test_delivery_faults, globals())
