"""``tests/unit/test_dedup_reads.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_dedup_reads

rerun(test_dedup_reads, globals())
