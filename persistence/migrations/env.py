"""Alembic's environment for the node database: run the migrations on the connection given.

:mod:`persistence.migration` opens the connection (in one transaction, on PostgreSQL with
the ``search_path`` set to the node's schema) and hands it over in the config's attributes;
nothing here reads an ``alembic.ini`` or a URL. Offline (``--sql``) mode is not supported.
"""

from __future__ import annotations

from alembic import context

config = context.config
if context.is_offline_mode():
    raise RuntimeError("fiberflow's migrations run on a live connection only (no --sql mode)")
context.configure(
    connection=config.attributes["connection"],
    version_table_schema=config.attributes.get("schema_name"),
    transactional_ddl=True,
    render_as_batch=True,
    on_version_apply=config.attributes.get("on_version_apply"),
)
with context.begin_transaction():
    context.run_migrations()
