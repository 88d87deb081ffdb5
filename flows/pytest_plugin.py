"""fiberflow's pytest plugin: fixtures that give a test a :class:`~flows.testing.MockNetwork`.

Installed with fiberflow (the ``pytest11`` entry point ``fiberflow``), so any project's tests
can use, without a conftest:

- ``mock_network``: a ``MockNetwork`` whose node databases live in the test's ``tmp_path``,
  stopped after the test. Its CorDapps come from the test's ``cordapps`` marker::

      @pytest.mark.cordapps("samples.pingpong")
      def test_ping(mock_network):
          alice = mock_network.create_node("O=Alice,L=London,C=GB")
          ...

  Without the marker the network has none: give each node its own with
  ``create_node(name, cordapps=[...])``.
- ``mock_network_factory``: a function taking ``MockNetwork``'s keyword arguments
  (``faults``, ``seed``, ``hospital``, ``database``, ...) that makes a network, as many as
  the test wants, each in a directory of its own under ``tmp_path``; ``cordapps`` defaults
  to the marker's. Every network it made is stopped after the test.

The CorDapp modules are imported when the network is made, so a misspelled module fails
the test's setup with an error naming it. Nothing heavy is imported until a fixture is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from flows.testing import MockNetwork

MARKER = "cordapps"
"""The marker naming the CorDapp modules of a test's ``mock_network``."""

MockNetworkFactory = Callable[..., "MockNetwork"]
"""The type of the ``mock_network_factory`` fixture: keyword arguments of ``MockNetwork``."""


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``cordapps`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*modules): the CorDapp modules of the test's mock_network "
        "(fiberflow's pytest plugin)",
    )


def marked_cordapps(node: pytest.Item) -> tuple[str, ...]:
    """The module names of ``node``'s closest ``cordapps`` marker (none: an empty tuple)."""
    marker = node.get_closest_marker(MARKER)
    if marker is None:
        return ()
    if marker.kwargs:
        pytest.fail(
            f"@pytest.mark.{MARKER} takes module names only, not keyword arguments "
            f"({', '.join(sorted(marker.kwargs))}) (in {node.nodeid})",
            pytrace=False,
        )
    if not marker.args:
        pytest.fail(
            f"@pytest.mark.{MARKER}() names no module: give at least one, such as "
            f'@pytest.mark.{MARKER}("samples.pingpong") (in {node.nodeid})',
            pytrace=False,
        )
    names = tuple(marker.args)
    for name in names:
        if not isinstance(name, str) or not name:
            pytest.fail(
                f"@pytest.mark.{MARKER} takes module names (strings), not {name!r} "
                f"(in {node.nodeid})",
                pytrace=False,
            )
    return names


def _check_cordapps(modules: Sequence[str]) -> None:
    """Import the CorDapps now, so a bad module name fails the setup, naming the module."""
    from flows.cordapps import CordappError, Cordapps

    if isinstance(modules, str):
        pytest.fail(
            f"mock_network: cordapps must be a list of module names, not the string {modules!r}",
            pytrace=False,
        )
    try:
        Cordapps(modules)
    except CordappError as error:
        problem = str(error)
    else:
        return
    pytest.fail(f"mock_network: {problem}", pytrace=False)


@pytest.fixture
def mock_network_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[MockNetworkFactory]:
    """Make ``MockNetwork``s for this test; each is stopped when the test ends.

    Call it with ``MockNetwork``'s keyword arguments. ``cordapps`` defaults to the modules
    of the test's ``cordapps`` marker; ``directory`` to a new directory under ``tmp_path``.
    """
    from flows.testing import MockNetwork

    default_cordapps = marked_cordapps(request.node)
    networks: list[MockNetwork] = []

    def make(**options: Any) -> MockNetwork:
        cordapps = options.pop("cordapps", default_cordapps)
        _check_cordapps(cordapps)
        directory = options.pop("directory", None)
        if directory is None:
            directory = tmp_path / f"mock-network-{len(networks)}"
        network = MockNetwork(cordapps, directory=directory, **options)
        networks.append(network)
        return network

    yield make
    for network in reversed(networks):
        network.stop_nodes()


@pytest.fixture
def mock_network(mock_network_factory: MockNetworkFactory) -> MockNetwork:
    """A ``MockNetwork`` with the CorDapps of the test's ``cordapps`` marker (see the module)."""
    return mock_network_factory()
