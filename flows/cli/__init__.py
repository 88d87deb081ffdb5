"""The ``fiberflow`` command line: one module per command, :mod:`flows.cli.main` dispatches.

``node run`` (:mod:`flows.process.command`), ``flow`` (:mod:`flows.cli.flow` over the HTTP API
with ``--url``, :mod:`flows.cli.local` against the node's database with ``--config``),
``checkpoints``, ``outbox`` (:mod:`flows.cli.outbox`), ``peer`` (:mod:`flows.cli.peer`),
``network`` (:mod:`flows.cli.network`), ``schedule`` (:mod:`flows.cli.schedule`), ``db``
(:mod:`flows.cli.db`), ``analyze`` (:mod:`flows.cli.analyze`) and ``demo``
(:mod:`flows.cli.demo`). ``python -m flows.cli`` runs it without the console script.

The top layer of ``flows``: it may import everything below it (the test harness, for the
in-process demo; the node process; the HTTP API client; the node; the config; the network).
"""
