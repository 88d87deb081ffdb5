"""The analytics tier: the Spark checks and their command line (``pytest tests/analytics``)."""
