"""The node's front door: an authenticated HTTP API served by the node process.

Off unless the node config has an ``[rpc]`` section (:mod:`flows.config.rpc`). The pieces,
one job each:

* :mod:`flows.config.rpc`: the ``[rpc]`` section and its users, checked at config load;
* :mod:`flows.rpc.hashing`: argon2 hashes of passwords and API tokens (``fiberflow rpc``);
* :mod:`flows.rpc.auth`: who a request comes from (HTTP Basic or a bearer token);
* :mod:`flows.rpc.arguments`: a flow instance from a class name and JSON arguments;
* :mod:`flows.rpc.gateway`: what the API reads and writes in the node database;
* :mod:`flows.rpc.app`: the routes (Starlette), their permissions and JSON answers;
* :mod:`flows.rpc.events`: the progress stream (server-sent events);
* :mod:`flows.rpc.server`: uvicorn serving the app on a thread of the node process.

The client side (httpx only: ``pip install 'fiberflow[client]'``):

* :mod:`flows.rpc.client`: :class:`~flows.rpc.client.RpcClient`, the API from Python;
* :mod:`flows.rpc.client_errors`: the API's refusals as an ``RpcError`` hierarchy;
* :mod:`flows.rpc.client_values`: started flows, outcomes, progress events, pages.

Importing this package loads none of Starlette, uvicorn or argon2: the modules that need
them import them, and only a node whose config has ``[rpc]`` imports those modules.
See docs/rpc.md.

It imports the node (its database, its inspection and operator commands), the config and
the API's names; only the node process (to serve it) and the command line import it.
"""
