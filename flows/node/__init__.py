"""The node: its assembly from a config, the :class:`~flows.node.node.Node` object, its parts.

- :mod:`flows.node.assembly`: :func:`~flows.node.assembly.build_node`, the one place a node
  is put together (the node process, the test network and the demo use it);
- :mod:`flows.node.node`: the node object (start and stop, flows and their outcomes, an
  operator's commands) and :mod:`flows.node.handles` (a started flow's handle);
- what it runs: :mod:`flows.node.fiber` (the greenlet glue, the only module that switches),
  :mod:`flows.node.effects` (side effects in the checkpoint's transaction),
  :mod:`flows.node.external_operations` (calls to the outside world off the scheduler),
  :mod:`flows.node.hospital` (what to do when something goes wrong),
  :mod:`flows.node.busy` (flows that run too long without suspending);
- what it takes from its database: :mod:`flows.node.flow_requests` (flows clients asked
  for), :mod:`flows.node.schedules` (flows started on a schedule),
  :mod:`flows.node.operator_commands` (commands an operator queued);
- read from outside: :mod:`flows.node.client` (``NodeClient``, through the node's database)
  and :mod:`flows.node.inspection` (what ``flow list`` and ``checkpoints dump`` show);
- :mod:`flows.node.instruments`: the hooks an observer (the metrics) may plug in.

It imports the API flows are written with, the network, the config and the lower packages
(the state machine, messaging, persistence); never the process, the servers or the CLI.
"""
