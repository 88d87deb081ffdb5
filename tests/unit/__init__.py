"""The unit tier: no services, no processes, no Spark; the fast loop (``pytest tests/unit``).

Network tests here run on SQLite only (``tests/unit/conftest.py``); the integration tier runs
them again with every node on PostgreSQL (``tests/integration/postgresql``).
"""
