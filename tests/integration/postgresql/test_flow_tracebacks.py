"""``tests/unit/test_flow_tracebacks.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_flow_tracebacks

rerun(test_flow_tracebacks, globals())
