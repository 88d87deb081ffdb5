"""``tests/unit/test_unknown_party.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_unknown_party

rerun(test_unknown_party, globals())
