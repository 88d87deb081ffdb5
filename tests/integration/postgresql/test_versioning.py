"""``tests/unit/test_versioning.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_versioning

rerun(test_versioning, globals())
