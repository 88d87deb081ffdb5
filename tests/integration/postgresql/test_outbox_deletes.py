"""``tests/unit/test_outbox_deletes.py`` again, with every node on PostgreSQL."""

from tests.integration.postgresql import rerun
from tests.unit import test_outbox_deletes

rerun(test_outbox_deletes, globals())
