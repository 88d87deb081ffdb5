"""Which node databases to analyze, and where the JDBC drivers are.

A node's own name is not stored in its tables (other nodes' tables name it, as ``sender``
and ``target``). A database is given either as a plain URL (``sqlite:///alice.db``): its node
name is then found in the other analyzed nodes' tables (see
``persistence.analytics.naming.infer_node_names``); or as ``NAME=URL``, for example
``O=Alice,L=London,C=GB=sqlite:///alice.db``, which names it outright. The name ends at the
first ``=`` that is followed by a URL scheme (``sqlite://``, ``postgresql://``), so X.500
names with their own ``=`` signs need no quoting beyond the shell's.

PostgreSQL nodes keep their tables in a schema of their own (``NodeDatabase(url,
schema_name=...)``): name it with a ``schema`` query parameter,
``O=Bob,L=Paris,C=FR=postgresql://postgres@db:5432/nodes?schema=bob``. Without it the
tables are looked up on the connection's search path.

Nothing here imports PySpark.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
from sqlalchemy.engine import URL, make_url

JDBC_JARS_ENVIRONMENT = "FIBERFLOW_JDBC_JARS"
"""Folders (or jar files), separated by ``os.pathsep``, to look for JDBC drivers in."""

DEFAULT_JAR_DIRECTORIES = ("/usr/share/java",)
"""Where Debian's ``libpostgresql-jdbc-java`` and ``libxerial-sqlite-jdbc-java`` put theirs."""

JAR_PATTERNS = {
    "postgresql": ("postgresql.jar", "postgresql-*.jar"),
    "sqlite": ("sqlite-jdbc.jar", "xerial-sqlite-jdbc*.jar", "sqlite-jdbc-*.jar"),
}
"""File names of each dialect's JDBC driver, most specific first."""

JDBC_DRIVER_CLASSES = {"postgresql": "org.postgresql.Driver", "sqlite": "org.sqlite.JDBC"}
"""The driver class of each dialect's JDBC jar."""

_NODE_ARGUMENT = re.compile(r"^(?P<name>.+?)=(?P<url>[A-Za-z][A-Za-z0-9+.-]*://.*)$")
_BARE_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class NodeArgumentError(ValueError):
    """A ``--node`` argument that is not ``NAME=URL`` with a supported URL."""


class KeyArgumentError(ValueError):
    """A ``--key-file`` or ``--node-config`` that cannot be used; the message says why."""


def check_key_names(keys: dict[str, bytes], node_names: list[str]) -> None:
    """Refuse a checkpoint key for a node that is not analyzed (names are known once loaded)."""
    for name in keys:
        if name not in node_names:
            raise KeyArgumentError(
                f"--key-file names {name}, which is not an analyzed node "
                f"(the nodes: {'; '.join(node_names)})"
            )


@attrs.frozen
class NodeSource:
    """One node database to analyze: the node's name, its SQLAlchemy URL and its schema."""

    name: str
    url: str
    """SQLAlchemy URL of the database (``sqlite:///...`` or ``postgresql://...``)."""
    schema: str | None = None
    """PostgreSQL schema holding the node's tables (None: the connection's search path)."""
    named: bool = True
    """False when given as a plain URL: ``name`` is then a stand-in (the URL) until the node's
    name is found in the other nodes' tables."""

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return dialect_of(self.url)

    @property
    def sqlite_path(self) -> Path:
        """The database file of a SQLite node."""
        if self.dialect != "sqlite":
            raise ValueError(f"{self.name} is not a SQLite node")
        database = make_url(self.url).database
        if not database or database == ":memory:":
            raise NodeArgumentError(f"{self.name}: a SQLite node needs a database file")
        return Path(database)

    def display_url(self) -> str:
        """The URL with any password hidden, and the schema shown as it was given."""
        shown = make_url(self.url).render_as_string(hide_password=True)
        if self.schema is not None:
            shown += ("&" if "?" in shown else "?") + f"schema={self.schema}"
        return shown


def dialect_of(url: str) -> str:
    """The database kind of a URL: ``"sqlite"`` or ``"postgresql"`` (else an error)."""
    backend = make_url(url).get_backend_name()
    if backend == "sqlite":
        return "sqlite"
    if backend in ("postgresql", "postgres"):
        return "postgresql"
    raise NodeArgumentError(f"unsupported database {url!r}: use sqlite:// or postgresql://")


def parse_node_argument(text: str) -> NodeSource:
    """Parse ``URL`` or ``NAME=URL`` (see the module docstring) into a :class:`NodeSource`."""
    text = text.strip()
    match = _NODE_ARGUMENT.match(text)
    named = not _BARE_URL.match(text)
    if named and match is None:
        raise NodeArgumentError(
            f"--node {text!r} must be a database URL or NAME=URL, e.g. "
            "'sqlite:///alice.db', 'O=Alice,L=London,C=GB=sqlite:///alice.db' or "
            "'O=Bob,L=Paris,C=FR=postgresql://postgres@host:5432/db?schema=bob'"
        )
    name, url = (match["name"].strip(), match["url"].strip()) if match and named else ("", text)
    try:
        parsed = make_url(url)
    except Exception as error:  # sqlalchemy's ArgumentError: not a URL at all
        raise NodeArgumentError(f"--node {text!r}: {url!r} is not a database URL") from error
    dialect = dialect_of(url)
    schema = parsed.query.get("schema")
    if isinstance(schema, tuple):
        raise NodeArgumentError(f"--node {text!r}: give one schema, not {list(schema)}")
    if schema is not None:
        if dialect != "postgresql":
            raise NodeArgumentError(f"--node {text!r}: a schema is for PostgreSQL nodes only")
        parsed = parsed.difference_update_query(["schema"])
    source = NodeSource(name, parsed.render_as_string(hide_password=False), schema, named)
    if not named:
        source = attrs.evolve(source, name=source.display_url())
    if dialect == "sqlite":
        source.sqlite_path  # noqa: B018 (validates: a file, not memory)
    return source


def check_unique_names(sources: Sequence[NodeSource]) -> None:
    """Refuse two databases given for the same node name."""
    seen: set[str] = set()
    for source in sources:
        if source.name in seen:
            raise NodeArgumentError(f"node {source.name} is given twice")
        seen.add(source.name)


@attrs.frozen
class JdbcJars:
    """The JDBC driver jars found (None where none was found)."""

    postgresql: Path | None = None
    sqlite: Path | None = None

    def for_dialect(self, dialect: str) -> Path | None:
        """The jar for ``"sqlite"`` or ``"postgresql"``."""
        found: Path | None = getattr(self, dialect)
        return found

    def paths(self) -> list[Path]:
        """Every jar found (for ``spark.jars``)."""
        return [jar for jar in (self.postgresql, self.sqlite) if jar is not None]


def jar_search_path(search: Iterable[str | os.PathLike[str]] | None = None) -> list[Path]:
    """Where to look: ``search`` if given, else ``$FIBERFLOW_JDBC_JARS``, else /usr/share/java."""
    if search is not None:
        return [Path(item) for item in search]
    configured = os.environ.get(JDBC_JARS_ENVIRONMENT)
    if configured:
        return [Path(item) for item in configured.split(os.pathsep) if item]
    return [Path(item) for item in DEFAULT_JAR_DIRECTORIES]


def find_jdbc_jars(search: Iterable[str | os.PathLike[str]] | None = None) -> JdbcJars:
    """Find the PostgreSQL and SQLite JDBC jars (see :func:`jar_search_path`)."""
    found: dict[str, Path] = {}
    for place in jar_search_path(search):
        for dialect, patterns in JAR_PATTERNS.items():
            if dialect in found:
                continue
            if place.is_file():
                if any(place.match(pattern) for pattern in patterns):
                    found[dialect] = place.resolve()
                continue
            if not place.is_dir():
                continue
            for pattern in patterns:
                matches = sorted(place.glob(pattern))
                if matches:
                    found[dialect] = matches[0].resolve()
                    break
    return JdbcJars(postgresql=found.get("postgresql"), sqlite=found.get("sqlite"))


def jdbc_url(source: NodeSource, snapshot_file: Path | None = None) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties (user, password) of a node database.

    A SQLite node is read from ``snapshot_file`` (its consistent copy) when given.
    """
    if source.dialect == "sqlite":
        path = snapshot_file if snapshot_file is not None else source.sqlite_path
        return f"jdbc:sqlite:{path.resolve()}", {}
    url: URL = make_url(source.url)
    properties: dict[str, str] = {}
    if url.username:
        properties["user"] = url.username
    if url.password:
        properties["password"] = str(url.password)
    host = url.host or "localhost"
    port = f":{url.port}" if url.port else ""
    query = "&".join(
        f"{key}={value}"
        for key, values in url.query.items()
        for value in (values if isinstance(values, tuple) else (values,))
    )
    suffix = f"?{query}" if query else ""
    return f"jdbc:postgresql://{host}{port}/{url.database or ''}{suffix}", properties
