"""External operations across SIGKILLs: a real node process calls a real HTTP service.

Alice runs as a ``fiberflow node run`` process; a quote service (:mod:`samples.quotes.service`)
listens on the loopback address, slow enough that kills land while calls are in flight and
between an answer and the checkpoint that journals it. Quote flows stream in while Alice is
killed with SIGKILL and restarted at seeded-random moments. Every flow must finish once,
with the answer the service gave for its key, and the service must have done the work once
per key: repeats (the at-least-once of operations) carry the same idempotency key.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from flows.node.client import decode_outcome
from persistence import schema
from samples.quotes import QuoteFlow
from samples.quotes.service import QuoteService
from tests.process_cluster import NAMES, ClusterNode

FLOWS, KILLS = 60, 5


@pytest.mark.slow
def test_one_effective_call_per_operation_across_sigkills(tmp_path: Path) -> None:
    rng = random.Random(21)
    service = QuoteService(delay=0.05, seed=21).start()
    queue = f"sqlite:///{tmp_path / 'queue.db'}"
    alice = ClusterNode(
        NAMES[0], tmp_path, None, queue, {"cordapps": ["samples.quotes"], "operation_threads": 4}
    )
    try:
        alice.start()
        alice.wait_started()
        ids: list[str] = []
        symbols: dict[str, str] = {}
        kills = 0
        batch = FLOWS // KILLS
        while len(ids) < FLOWS:
            chunk = [QuoteFlow(f"S{len(ids) + i}", service.url) for i in range(batch)]
            started = alice.client.start_flows(chunk)
            symbols.update({fid: flow.symbol for fid, flow in zip(started, chunk, strict=True)})
            ids += started
            time.sleep(rng.uniform(0.05, 0.4))  # calls in flight, answers being journaled
            alice.kill()
            kills += 1
            alice.start()
            alice.wait_started()
        outcomes = alice.client.wait(ids, timeout=180)
    finally:
        alice.stop()
        alice.client.close()
        service.stop()
    assert kills == KILLS
    for flow_id in ids:
        quote = decode_outcome(outcomes[flow_id])
        key = f"{flow_id}:op:0"
        assert quote["symbol"] == symbols[flow_id] and quote["key"] == key
        assert service.effective[key] == 1, (key, service.calls[key])
    assert sum(service.effective.values()) == FLOWS
    repeats = sum(service.calls.values()) - FLOWS
    print(f"{kills} SIGKILLs, {FLOWS} flows, {repeats} repeated calls answered by key")
    assert alice.counts(schema.node_flow_results) == {"QuoteFlow": FLOWS}
