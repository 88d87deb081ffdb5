"""Which modules one session message passes, from ``send()`` to the peer's ``receive()``.

Two nodes on the test network exchange one marked payload (:mod:`benchmarks.walk_flows`).
A profile hook records every call of a function of the project whose arguments hold the
marker: in bytes or text, or inside the fields of attrs values, tuples, lists, dicts and
persistent vectors (up to five levels deep), from the moment the sender starts until the
receiver's ``receive()`` has returned it. The message changes form on its way (payload
bytes, ``Send`` request, session message, encoded message, tagged frame, and back), and
each form holds the marker, so the record follows it through every module that handles it.

It prints each module with the functions that took the message, then three counts that do
not depend on load: the modules, the legs between packages (a leg ends where the next call
is in another top-level package), and the climbs back up (legs from a lower layer to a
higher one: ``statemachine`` < ``persistence`` < ``messaging`` < ``flows``). The in-memory
transport carries the message (its one module stands where a real transport's consumer and
broker would).

    .venv/bin/python benchmarks/message_walk.py                 # this checkout
    .venv/bin/python benchmarks/message_walk.py --root /tmp/old  # another checkout
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
from types import FrameType
from typing import Any

LAYERS = {"statemachine": 1, "persistence": 2, "messaging": 3, "flows": 4}
"""The packages from the bottom up (an import only ever goes down)."""

_DEPTH = 5
_ITEMS = 64


def holds(value: Any, marker: str, depth: int = 0) -> bool:
    """True if ``value`` holds ``marker`` (as text or UTF-8 bytes), looked for in its parts."""
    import attrs

    if depth > _DEPTH or value is None or isinstance(value, int | float | bool):
        return False
    if isinstance(value, bytes | bytearray | memoryview):
        return marker.encode() in bytes(value)
    if isinstance(value, str):
        return marker in value
    if isinstance(value, dict):
        return any(holds(v, marker, depth + 1) for v in list(value.values())[:_ITEMS])
    if isinstance(value, tuple | list):
        return any(holds(v, marker, depth + 1) for v in value[:_ITEMS])
    if attrs.has(type(value)):
        fields = attrs.fields(type(value))
        return any(holds(getattr(value, f.name, None), marker, depth + 1) for f in fields)
    if type(value).__name__ in ("PVector", "PMap", "SessionTable", "deque"):
        return any(holds(v, marker, depth + 1) for v in list(value)[:_ITEMS])
    return False


def walk(root: str) -> list[tuple[str, str]]:
    """(module path, function) of every call that took the message, in order."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [root]
    sys.path.append(here)  # walk_flows, loaded by name as the nodes' CorDapp
    import walk_flows  # type: ignore[import-not-found]

    from flows.testing import MockNetwork

    visits: list[tuple[str, str]] = []
    skipped = (os.sep + "tests" + os.sep, os.sep + ".venv" + os.sep, here)

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call" or not walk_flows.WALK["on"]:
            return
        path = frame.f_code.co_filename
        if not path.startswith(root + os.sep) or any(s in path for s in skipped):
            return
        for name, value in list(frame.f_locals.items()):
            if name != "self" and holds(value, walk_flows.MARKER):
                visits.append((os.path.relpath(path, root), frame.f_code.co_qualname))
                return

    network = MockNetwork(cordapps=["walk_flows"])
    alice = network.create_node("O=Alice,L=London,C=GB")
    bob = network.create_node("O=Bob,L=Paris,C=FR")
    handle = alice.start_flow(walk_flows.WalkSender(bob.party))
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        network.run_network()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    handle.result()
    if walk_flows.WALK["on"]:
        raise SystemExit("the receiver never received the marker: the walk did not end")
    return visits


def main() -> None:
    """Trace one message in the checkout at ``--root`` (default: this one) and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--root", default=default_root, help="the checkout to trace")
    root = os.path.abspath(parser.parse_args().root)
    visits = walk(root)
    modules: list[str] = []
    for module, _ in visits:
        if module not in modules:
            modules.append(module)
    print(f"one message, send() to receive(), in {root}:")
    for module in modules:
        functions = sorted({function for m, function in visits if m == module})
        print(f"  {module}: {', '.join(functions)}")
    packages = [module.split(os.sep)[0] for module, _ in visits]
    legs = [p for i, p in enumerate(packages) if i == 0 or packages[i - 1] != p]
    climbs = sum(1 for a, b in itertools.pairwise(legs) if LAYERS.get(b, 0) > LAYERS.get(a, 0))
    print(f"modules: {len(modules)}")
    print(f"package legs: {len(legs)} ({' > '.join(legs)})")
    print(f"climbs back up: {climbs}")


if __name__ == "__main__":
    main()
