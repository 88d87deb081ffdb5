"""The network: who the nodes are, their keys and addresses, and who may join.

- :mod:`flows.network.identity`: a node's key pairs (its key file) and its peers' public
  keys; which counterparties it can reach;
- :mod:`flows.network.map`: the network map (a folder of signed node-infos);
- :mod:`flows.network.trust`: the network trust root, as the nodes check it;
- :mod:`flows.network.doorman`: the trust root's own side (create it, issue certificates);
- :mod:`flows.network.peer_directory`: where each peer's inbound is (for the bridges).

It imports only the API's data types (``Party``, the errors) and the lower packages.
"""
