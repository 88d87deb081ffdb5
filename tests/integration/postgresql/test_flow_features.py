"""``tests/unit/test_flow_features.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_flow_features

rerun(test_flow_features, globals())
