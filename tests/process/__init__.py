"""The process tier: real node processes, subprocesses, a browser (``pytest tests/process``)."""
