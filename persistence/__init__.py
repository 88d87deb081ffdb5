"""Persistence: the node schema, the SQLAlchemy store, serialization and Spark analytics."""
