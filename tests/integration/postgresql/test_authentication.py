"""``tests/unit/test_authentication.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_authentication

rerun(test_authentication, globals())
