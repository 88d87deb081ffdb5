"""The shared layer: what ``messaging`` and ``persistence`` both need, so neither imports the other.

- :mod:`foundation.serialization`: payloads to bytes and back (msgpack with an allow-list of
  types) within size limits;
- :mod:`foundation.bounded`: text cut to a bound before anything stores it;
- :mod:`foundation.engine`: opening a node's SQL database through SQLAlchemy (SQLite pragmas,
  a PostgreSQL schema per node), which the SQL queue transport and the node store share.

It sits above :mod:`statemachine` (its limits) and imports no other fiberflow package.
"""
