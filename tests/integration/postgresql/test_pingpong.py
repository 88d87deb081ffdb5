"""``tests/unit/test_pingpong.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_pingpong

rerun(test_pingpong, globals())
