"""What issue 14's goal 1 leaves for the framework, once the hub and authentication are paid.

Goal 1 asks the in-memory ping/pong for at least 40% of the bare greenlet + msgpack hub's
rate (:func:`benchmarks.bounds.greenlet_pairs_per_second`): at most 2.5 times the hub's time
per pair. This script measures, in one run:

* the hub's time per pair, and so the goal's budget per pair (2.5 times it);
* what authentication costs per pair: the four messages of a ping/pong tagged by the
  sender's :class:`~messaging.authentication.MessageAuthenticator` and checked by the
  receiver's :class:`~messaging.authentication.MessageVerifier` (docs/security.md promises
  it for every message);
* the transitions one ping/pong takes and what one step of immutable state costs (a real
  flow state given a new checkpoint: two :func:`~statemachine.immutable.replace` calls, the least
  a transition that checkpoints does);
* fiberflow's own time per pair (``benchmarks/pingpong.py``'s ``off`` configuration).

It prints what is left of the budget for everything else a transition does (routing,
sessions, the journal, dedup ids, the fiber switch), per transition, beside what fiberflow
spends per transition now. Run: ``python benchmarks/floor.py [--flows 3000]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import statemachine.manager as manager_module
from benchmarks.bounds import greenlet_pairs_per_second
from benchmarks.pingpong import run
from flows.process.gc_tuning import tune_collector
from flows.testing import MockNetwork
from messaging.service import Message
from samples.pingpong import PingFlow
from statemachine.immutable import replace
from statemachine.state import FlowState
from statemachine.transition import transition

MESSAGES_PER_PAIR = 4
"""Session init, confirm, the pong, and the session end."""


def _per_call(action: Any, repeats: int) -> float:
    """Seconds per call of ``action``, best of three runs of ``repeats`` calls."""
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        for _ in range(repeats):
            action()
        best = min(best, (time.perf_counter() - began) / repeats)
    return best


def _observe(flows: int) -> tuple[float, list[FlowState], float]:
    """Run ``flows`` ping/pongs on the test network.

    Returns the transitions per pair, some of the flow states they produced, and the seconds
    one message costs to authenticate and check between the two nodes.
    """
    original = transition
    states: list[FlowState] = []
    calls = 0

    def counting(state: FlowState | None, event: Any) -> Any:
        nonlocal calls
        calls += 1
        result = original(state, event)
        if len(states) < 100 and isinstance(result.state, FlowState):
            states.append(result.state)
        return result

    with tempfile.TemporaryDirectory() as directory:
        net = MockNetwork(cordapps=["samples.pingpong"], directory=directory, database="memory")
        try:
            alice = net.create_node("O=Alice,L=London,C=GB")
            bob = net.create_node("O=Bob,L=New York,C=US")
            alice.start_flows([PingFlow(bob.party) for _ in range(10)])
            net.run_network()
            authenticator = alice.node.authenticator
            sent: list[Message] = []
            tag = authenticator.authenticate

            def recording(message: Message, target: str) -> Message:
                sent.append(message)
                return tag(message, target)

            names = vars(manager_module)
            names["transition"] = counting
            authenticator.authenticate = recording  # type: ignore[method-assign]
            try:
                alice.start_flows([PingFlow(bob.party) for _ in range(flows)])
                net.run_network()
            finally:
                names["transition"] = original
                authenticator.authenticate = tag  # type: ignore[method-assign]
            message = sent[len(sent) // 2]  # a real session message Alice sent Bob
            tagged = alice.node.authenticator.authenticate(message, bob.party.name)
            if bob.node.inbound.verifier.problem(tagged) is not None:
                raise SystemExit("the sample message did not authenticate")
            auth = _per_call(
                lambda: bob.node.inbound.verifier.problem(
                    alice.node.authenticator.authenticate(message, bob.party.name)
                ),
                20_000,
            )
        finally:
            net.stop_nodes()
    return calls / flows, states, auth


def main() -> None:
    """Measure and print the floor (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--flows", type=int, default=3000)
    args = parser.parse_args()
    tune_collector()
    hub = 1 / greenlet_pairs_per_second(max(args.flows * 10, 20_000))
    budget = 2.5 * hub
    transitions, states, per_message = _observe(min(args.flows, 1000))
    auth = per_message * MESSAGES_PER_PAIR
    state = states[len(states) // 2]
    checkpoint = state.checkpoint

    def one_step() -> FlowState:
        changed = replace(checkpoint, version=checkpoint.version + 1)
        return replace(state, checkpoint=changed)

    step = _per_call(one_step, 50_000)
    fiberflow = 1 / run("off", args.flows, 100)["flows/s"]
    left = budget - hub - auth
    print(f"bare hub: {hub * 1e6:.1f} us per pair; goal 1's budget (2.5x): {budget * 1e6:.1f} us")
    print(
        f"authentication, {MESSAGES_PER_PAIR} messages tagged and checked: {auth * 1e6:.1f} us "
        f"per pair ({auth / budget:.0%} of the budget)"
    )
    print(f"transitions per pair: {transitions:.1f}; one immutable state step: {step * 1e6:.2f} us")
    print(
        f"left for the framework: {left * 1e6:.1f} us per pair = "
        f"{left / transitions * 1e6:.2f} us per transition, all of it included "
        f"({left / transitions / step:.1f} state steps' worth)"
    )
    spent = fiberflow - hub - auth
    print(
        f"fiberflow now: {fiberflow * 1e6:.1f} us per pair ({hub / fiberflow:.1%} of the hub's "
        f"rate); beyond hub and authentication {spent / transitions * 1e6:.1f} us per "
        f"transition ({spent / left:.1f}x what the goal leaves)"
    )


if __name__ == "__main__":
    main()
