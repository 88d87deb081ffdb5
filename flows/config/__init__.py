"""A node's configuration as data: the config file (TOML) read and checked, nothing started.

- :mod:`flows.config.runtime`: a node process's config file, :class:`RuntimeConfig`, and
  :func:`~flows.config.runtime.load_config`, which fails with the file and the field named;
- :mod:`flows.config.node`: :class:`~flows.config.node.NodeConfig`, what a node needs to
  start (the part of the file :func:`~flows.node.assembly.build_node` reads);
- :mod:`flows.config.rpc`: the ``[rpc]`` section and its users.

It imports the network's data types (:mod:`flows.network`), the CorDapp loader (to check
the modules and the flows the config names) and constants of the lower packages; never the
node, its process or its servers.
"""
