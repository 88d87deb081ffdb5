"""``tests/unit/test_session_facts.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_session_facts

rerun(test_session_facts, globals())
