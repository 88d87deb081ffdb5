"""``tests/unit/test_message_sizes.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_message_sizes

rerun(test_message_sizes, globals())
