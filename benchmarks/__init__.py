"""Reproducible performance runs (not part of the test suite)."""
