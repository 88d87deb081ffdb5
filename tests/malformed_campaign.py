"""Long campaign of hostile inbound inputs: ``python -m tests.malformed_campaign [--examples N]``.

Runs ``N`` hypothesis examples (default 10,000), each a list of up to 15 generated inputs
injected into a node while it serves ping/pong (see ``tests/malformed.py``), and prints how
many examples and inputs ran and how they were refused.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.cli.progress import ProgressBar
from tests.malformed import Injection, inbound_garbage, survives


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--examples", type=int, default=10_000)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    totals: Counter[str] = Counter()
    bar = ProgressBar(args.examples, "examples")
    began = time.perf_counter()

    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(inbound_garbage(), min_size=1, max_size=15))
    def campaign(injections: list[Injection]) -> None:
        totals.update(survives(injections))
        totals["examples"] += 1
        totals["inputs"] += len(injections)
        bar.update(totals["examples"])

    campaign()
    bar.finish()
    print(
        f"{totals['examples']} examples, {totals['inputs']} hostile inputs in "
        f"{time.perf_counter() - began:.0f} s; the node served every ping/pong. Refused: "
        f"{totals['transport_dead_letters']} at the transport (frame), "
        f"{totals['node_dead_letters']} dead-lettered by the node, "
        f"{totals['rejected_sessions']} sessions rejected, {totals['late_dropped']} dropped "
        f"as late, {totals['duplicates']} duplicates"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
