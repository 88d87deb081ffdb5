"""A node in its own process: ``fiberflow node run``.

- :mod:`flows.process.command`: the command (load the config, run, exit status);
- :mod:`flows.process.process`: :class:`~flows.process.process.NodeProcess`, its lifecycle,
  signals and serving loop, holding the node's lease;
- :mod:`flows.process.node_keeper`: the node kept running (rebuilt after a node-wide failure,
  and on the partitions a rebalance leaves a worker);
- :mod:`flows.process.side_servers`: the metrics and HTTP API servers beside the node;
- :mod:`flows.process.status`: the status file and the periodic report;
- :mod:`flows.process.database_wait`, :mod:`flows.process.logs`,
  :mod:`flows.process.gc_tuning`: start-up details.

It may import the node, the HTTP API (to serve it), the metrics, the config and the network;
nothing imports it but the command line.
"""
