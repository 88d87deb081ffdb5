"""``tests/unit/test_flow_effects.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_flow_effects

rerun(test_flow_effects, globals())
