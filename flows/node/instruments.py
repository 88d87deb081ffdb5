"""What a node lets an observer hook into (metrics), without knowing what observes it.

A :class:`~flows.node.node.Node` built with ``instruments`` hands them its checkpoint store and
its fiber factory before it wires the state machine (the instruments may wrap them, to time
commits and replays), tells them once it is built, and calls them after every round. A node
built without instruments (the default) runs none of this: no wrapper, no call.
:mod:`flows.metrics` is the one implementation; this module imports nothing of it, so a
node without metrics configured never loads the Prometheus client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from statemachine.ports import CheckpointStore, FiberFactory

if TYPE_CHECKING:
    from flows.node.node import Node


class NodeInstruments(Protocol):
    """Hooks a node calls when built with ``instruments`` (see the module docstring)."""

    def checkpoint_store(self, store: CheckpointStore) -> CheckpointStore:
        """The store the state machine should use (``store``, or one wrapping it)."""

    def fibers(self, factory: FiberFactory) -> FiberFactory:
        """The fiber factory the state machine should use (``factory``, or a wrapper)."""

    def bind(self, node: Node) -> None:
        """The node is built: add listeners, start reading its counters."""

    def after_round(self) -> None:
        """A scheduling round of the node ended."""
