"""The Alembic migration environment of the node database (``env.py`` and ``versions/``).

Shipped inside the package, so an installed fiberflow can upgrade a node database without
an ``alembic.ini``: :mod:`persistence.migration` configures Alembic in code and points it
here. Revision ids are the schema versions, four digits: ``0007`` is the baseline (the schema
a database had before fiberflow used Alembic), ``0008`` the next, and so on.
"""
