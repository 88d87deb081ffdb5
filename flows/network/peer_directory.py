"""Where peers' inbounds are, from the network map (what the bridges ask before each send).

In the peer-to-peer topology every node publishes the address of its own inbound (its
``transport`` field, without credentials) in its node-info. :class:`NetworkMapDirectory`
reads the map at most every ``reload_seconds``, so a bridge follows a peer that moved or left
within about a second of its node-info changing.
"""

from __future__ import annotations

import threading
import time

from flows.network.map import NetworkMap, NodeInfo

__all__ = ["NetworkMapDirectory"]


class NetworkMapDirectory:
    """A :class:`~messaging.bridges.PeerDirectory` over a network map directory."""

    def __init__(self, network_map: NetworkMap, reload_seconds: float = 1.0) -> None:
        """Look peers up in ``network_map``, re-reading it at most every ``reload_seconds``."""
        self._map = network_map
        self._reload_seconds = reload_seconds
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {}
        self._loaded_at = -1e9

    def address_of(self, name: str) -> str | None:
        """The inbound address ``name`` published, or None if it is not in the map."""
        info = self.nodes().get(name)
        return None if info is None else info.transport

    def nodes(self) -> dict[str, NodeInfo]:
        """Every node in the map, by name (at most ``reload_seconds`` old)."""
        with self._lock:
            if time.monotonic() - self._loaded_at >= self._reload_seconds:
                self._nodes = self._map.nodes()
                self._loaded_at = time.monotonic()
            return self._nodes
