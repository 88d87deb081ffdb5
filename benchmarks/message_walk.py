"""Which modules one session message passes, from ``send()`` to the peer's ``receive()``.

Two nodes on the test network exchange one marked payload (:mod:`benchmarks.walk_flows`).
A profile hook records every call of a function of the project whose arguments hold the
marker: in bytes or text, or inside the fields of attrs values, tuples, lists, dicts and
persistent vectors (up to five levels deep), from the moment the sender starts until the
receiver's ``receive()`` has returned it. The message changes form on its way (payload
bytes, ``Send`` request, session message, encoded message, tagged frame, and back), and
each form holds the marker, so the record follows it through every module that handles it.

It prints each module with the functions that took the message, then counts that do not
depend on load: the modules; the legs between packages (a leg ends where the next call is in
another top-level package) and, of those, the ones that go to a higher layer (``statemachine``
< ``foundation`` < ``persistence`` and ``messaging`` < ``flows``), a return to a caller
included; and the calls into a higher layer, caller to callee, each named: the state machine at the
bottom calling through its ports (:mod:`statemachine.ports`: its store, codec, relay and
fibers, objects it was handed), or a climb back up: any other call into a higher layer, by
import (which the import contracts forbid) or through a callback a higher layer registered
(as a transport calling a node's handler). The in-memory transport
carries the message (its one module stands where a real transport's consumer and broker
would).

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

LAYERS = {"statemachine": 1, "foundation": 2, "persistence": 3, "messaging": 3, "flows": 4}
"""The packages from the bottom up (an import only ever goes down)."""

Visit = tuple[str, str, str | None]
"""(module path, function, the module path of its nearest caller in the project, if any)."""

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


def walk(root: str) -> list[Visit]:
    """Every call that took the message, in order, with its caller's module."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [root]
    sys.path.append(here)  # walk_flows, loaded by name as the nodes' CorDapp
    import walk_flows  # type: ignore[import-not-found]

    from flows.testing import MockNetwork

    visits: list[Visit] = []
    skipped = (os.sep + "tests" + os.sep, os.sep + ".venv" + os.sep, here)

    def ours(path: str) -> bool:
        return path.startswith(root + os.sep) and not any(s in path for s in skipped)

    def caller_of(frame: FrameType) -> str | None:
        """The module of the nearest frame below ``frame`` that is the project's own."""
        back = frame.f_back
        while back is not None and not ours(back.f_code.co_filename):
            back = back.f_back
        return None if back is None else os.path.relpath(back.f_code.co_filename, root)

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call" or not walk_flows.WALK["on"]:
            return
        path = frame.f_code.co_filename
        if not ours(path):
            return
        for name, value in list(frame.f_locals.items()):
            if name != "self" and holds(value, walk_flows.MARKER):
                module = os.path.relpath(path, root)
                visits.append((module, frame.f_code.co_qualname, caller_of(frame)))
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


def package_of(module: str) -> str:
    """The top-level package of a module path (``statemachine/manager.py``: ``statemachine``)."""
    return module.split(os.sep)[0]


def imports(root: str, importer: str, imported: str) -> bool:
    """True if the module at path ``importer`` imports the module at path ``imported``."""
    import ast

    dotted = imported.removesuffix(".py").removesuffix("/__init__").replace(os.sep, ".")
    with open(os.path.join(root, importer)) as source:
        tree = ast.parse(source.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            if node.module == dotted or dotted in named:
                return True
        elif isinstance(node, ast.Import) and any(a.name == dotted for a in node.names):
            return True
    return False


def main() -> None:
    """Trace one message in the checkout at ``--root`` (default: this one) and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--root", default=default_root, help="the checkout to trace")
    root = os.path.abspath(parser.parse_args().root)
    visits = walk(root)
    modules: list[str] = []
    for module, _, _ in visits:
        if module not in modules:
            modules.append(module)
    print(f"one message, send() to receive(), in {root}:")
    for module in modules:
        functions = sorted({function for m, function, _ in visits if m == module})
        print(f"  {module}: {', '.join(functions)}")
    packages = [package_of(module) for module, _, _ in visits]
    legs = [p for i, p in enumerate(packages) if i == 0 or packages[i - 1] != p]
    climbs = sum(1 for a, b in itertools.pairwise(legs) if LAYERS.get(b, 0) > LAYERS.get(a, 0))
    print(f"modules: {len(modules)}")
    print(f"package legs: {len(legs)} ({' > '.join(legs)})")
    print(f"legs to a higher layer (returns to a caller included): {climbs}")
    upward = sorted(
        {
            (caller, module)
            for module, _, caller in visits
            if caller is not None
            and LAYERS.get(package_of(module), 0) > LAYERS.get(package_of(caller), 0)
        }
    )
    ports = [(a, b) for a, b in upward if package_of(a) == "statemachine"]
    by_import = [(a, b) for a, b in upward if imports(root, a, b)]
    print(f"calls into a higher layer: {len(upward)}")
    for caller, module in upward:
        how = (
            "by import"
            if (caller, module) in by_import
            else "a port of the state machine"
            if (caller, module) in ports
            else "a callback"
        )
        print(f"  {caller} -> {module} ({how})")
    print(f"  through the state machine's ports (statemachine/ports.py): {len(ports)}")
    print(f"  climbs back up (any other, by import or callback): {len(upward) - len(ports)}")


if __name__ == "__main__":
    main()
