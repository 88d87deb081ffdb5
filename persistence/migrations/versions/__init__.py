"""The migration scripts, one per schema version (Alembic loads them by path)."""
