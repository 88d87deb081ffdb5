"""What a snapshot of the node databases holds: the :class:`Snapshot`.

A :class:`Snapshot` holds the tables of :data:`~persistence.analytics.tables.TABLES` as Spark
DataFrames, one per table with every analyzed node's rows and a ``node`` column, and says
how each node was read (:class:`NodeLoad`). :mod:`persistence.analytics.loading` makes it;
the checks read it. Nothing here imports PySpark at run time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from persistence.analytics.opening import OpenedDatabase
    from persistence.analytics.sources import NodeSource

T = TypeVar("T")


@attrs.frozen
class NodeLoad:
    """How one node's tables were read."""

    name: str
    url: str
    """The database URL, password hidden."""
    path: str
    """``"jdbc"`` or ``"arrow"``."""
    detail: str
    """The driver or the reason for the fallback, and the partitions."""
    snapshot: str
    """How the consistent snapshot was taken."""
    taken_at_ms: int
    """Wall-clock time of the snapshot (ms since the epoch)."""
    rows: dict[str, int]
    """Rows per frame name (``checkpoints``, ``message_ids``, ...)."""
    named_by: str = "argument"
    """Where the node's name came from: ``argument`` (``NAME=URL``), ``other nodes`` (found
    in the other nodes' tables) or ``unknown`` (the URL stands in for it)."""


@attrs.define
class Snapshot:
    """The node tables of every analyzed node, as Spark DataFrames with a ``node`` column.

    Use it as a context manager: on exit the cached data, the held PostgreSQL transactions
    and the staging files are released.
    """

    spark: SparkSession
    nodes: list[NodeLoad]
    frames: dict[str, DataFrame]
    _cleanup: list[Callable[[], None]] = attrs.field(factory=list, alias="cleanup")
    databases: dict[str, tuple[OpenedDatabase, NodeSource]] = attrs.field(factory=dict)
    """Node name to the database opened at its snapshot and the node's source: what reads
    beyond :data:`~persistence.analytics.tables.TABLES` go through (the checkpoint blobs, when
    a key is given)."""
    checkpoint_keys: dict[str, bytes] = attrs.field(factory=dict, repr=False)
    """Node name to its checkpoint MAC key (``--key-file``): the nodes whose checkpoint
    blobs are decoded and checked (:mod:`persistence.analytics.checks.checkpoint_blobs`)."""
    layouts: dict[str, DataFrame] = attrs.field(factory=dict)
    """The export's bucketed datasets of every node (``evidence``, ``flows``:
    :mod:`persistence.analytics.layout`), when each analyzed node has them; else empty."""
    _shared: dict[str, DataFrame] = attrs.field(factory=dict, alias="shared")
    _values: dict[Any, Any] = attrs.field(factory=dict, alias="values")
    parent: Snapshot | None = None
    """The whole snapshot, when this one is restricted to a part of it (the candidates of
    :mod:`persistence.analytics.candidates`): what a rule needs of every row (the latest
    record per node and sender, say) is read from the parent."""

    @property
    def whole(self) -> Snapshot:
        """The unrestricted snapshot: :attr:`parent`, or this one."""
        return self.parent if self.parent is not None else self

    def shared_value(self, key: Any, build: Callable[[], T]) -> T:
        """A value several checks use (the screening of the conversations), built once.

        ``key`` identifies it (with the settings it depends on); whatever it caches in Spark
        it releases through :meth:`on_close`.
        """
        if key not in self._values:
            self._values[key] = build()
        return self._values[key]  # type: ignore[no-any-return]

    def shared_frame(self, name: str, build: Callable[[], DataFrame]) -> DataFrame:
        """The frame ``name`` several checks use: built by ``build()`` and cached once.

        The cache is released when the snapshot closes. Checks call it through
        :func:`persistence.analytics.check_results.shared`.
        """
        if name not in self._shared:
            from pyspark import StorageLevel

            frame = build().persist(StorageLevel.MEMORY_AND_DISK)
            self._shared[name] = frame
            self.on_close(frame.unpersist)
        return self._shared[name]

    @property
    def node_names(self) -> list[str]:
        """The analyzed nodes, in the order given."""
        return [node.name for node in self.nodes]

    @property
    def taken_at_ms(self) -> int:
        """The earliest snapshot time: the default "now" of the time-based checks."""
        return min(node.taken_at_ms for node in self.nodes)

    @property
    def spread_ms(self) -> int:
        """Time between the first and the last snapshot (0 when taken in one transaction)."""
        return max(n.taken_at_ms for n in self.nodes) - min(n.taken_at_ms for n in self.nodes)

    @property
    def checkpoints(self) -> DataFrame:
        """``node_checkpoints`` of every node, with ``node``."""
        return self.frames["checkpoints"]

    @property
    def blobs(self) -> DataFrame:
        """``node_checkpoint_blobs``: only ``flow_id`` and ``node`` (the blob is never read)."""
        return self.frames["blobs"]

    @property
    def results(self) -> DataFrame:
        """``node_flow_results`` (no result blobs), with ``node``."""
        return self.frames["results"]

    @property
    def exceptions(self) -> DataFrame:
        """``node_flow_exceptions``, with ``node``."""
        return self.frames["exceptions"]

    @property
    def message_ids(self) -> DataFrame:
        """``node_message_ids`` (the dedup ids of consumed messages), with ``node``."""
        return self.frames["message_ids"]

    @property
    def outbox(self) -> DataFrame:
        """``node_outbox`` (no payloads), with ``node``."""
        return self.frames["outbox"]

    @property
    def paused(self) -> DataFrame:
        """``node_paused_flows`` (flows an operator paused), with ``node``."""
        return self.frames["paused"]

    @property
    def workers(self) -> DataFrame:
        """``node_workers`` (the processes running the node: lease renewals), with ``node``."""
        return self.frames["workers"]

    def on_close(self, release: Callable[[], object]) -> None:
        """Have ``release`` called when the snapshot closes (cached check results).

        A restricted snapshot hands it to its parent, which is the one that is closed.
        """
        if self.parent is not None:
            self.parent.on_close(release)
            return

        def run() -> None:
            release()

        self._cleanup.append(run)

    def close(self) -> None:
        """Release the cache, the held transactions and the staging files.

        Every release is tried even when one fails (a JVM that died takes the cache with
        it, but the transactions and files are still this process's); the first error is
        raised after all were tried.
        """
        releases: list[Callable[[], object]] = [frame.unpersist for frame in self.frames.values()]
        while self._cleanup:
            releases.append(self._cleanup.pop())
        first: Exception | None = None
        for release in releases:
            try:
                release()
            except Exception as error:
                first = first or error
        if first is not None:
            raise first

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            self.close()
        except Exception:
            if kind is None:
                raise
            # the error that ended the block is the one to report; this one follows from it
            logging.getLogger(__name__).debug("closing the snapshot failed too", exc_info=True)
