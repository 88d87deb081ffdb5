"""``python -m flows.cli``: the ``fiberflow`` command, without its console script."""

import sys

from flows.cli.main import main

sys.exit(main())
