"""``tests/unit/test_sqlqueue_partitions.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_sqlqueue_partitions

rerun(test_sqlqueue_partitions, globals())
