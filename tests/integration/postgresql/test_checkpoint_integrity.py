"""``tests/unit/test_checkpoint_integrity.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_checkpoint_integrity

rerun(test_checkpoint_integrity, globals())
