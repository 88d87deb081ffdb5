"""``tests/unit/test_flow_request_statements.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_flow_request_statements

rerun(test_flow_request_statements, globals())
