from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.testing import MockNetwork

CORDAPPS = ["samples.pingpong", "samples.trade", "tests.cordapp"]


@pytest.fixture
def net(tmp_path: Path) -> Iterator[MockNetwork]:
    network = MockNetwork(cordapps=CORDAPPS, directory=tmp_path)
    yield network
    network.stop_nodes()


@pytest.fixture(autouse=True)
def _reset_test_behaviour() -> Iterator[None]:
    from tests import cordapp

    cordapp.BEHAVIOUR.clear()
    yield
    cordapp.BEHAVIOUR.clear()
