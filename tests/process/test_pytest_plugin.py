"""fiberflow's pytest plugin, used as a user would: a test file of theirs, run by pytest.

Each test writes a small test module into pytester's directory and runs pytest on it in a
process of its own (the plugin comes from the installed ``pytest11`` entry point, as in any
project that installs fiberflow), then checks the outcomes and what the report says. A
subprocess, not pytester's in-process run: that one restores ``sys.modules`` afterwards, so
the flows the user's tests imported would be imported (and registered) a second time by the
tests that run after it in this process.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

ARGS = ("-p", "no:cacheprovider", "--strict-markers", "-W", "error")


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makepyfile(test_user=source)
    return pytester.runpytest_subprocess(*ARGS)


USER_TESTS = """
import pytest

from flows.testing import MockNetwork
from messaging.inmemory import Faults
from samples.pingpong import PingFlow, PongFlow

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=New York,C=US"


@pytest.mark.cordapps("samples.pingpong")
def test_ping(mock_network, tmp_path):
    assert mock_network.directory.parent == tmp_path
    alice = mock_network.create_node(ALICE)
    bob = mock_network.create_node(BOB)
    handle = alice.start_flow(PingFlow(bob.party))
    mock_network.run_network()
    assert handle.result() == "Pong"


@pytest.mark.cordapps("samples.pingpong")
def test_bob_dies_after_commit(mock_network):
    alice = mock_network.create_node(ALICE)
    bob = mock_network.create_node(BOB)
    bob.crash_at("after_commit")
    handle = alice.start_flow(PingFlow(bob.party))
    mock_network.run_network()
    assert bob.crashes == 1
    assert handle.result() == "Pong"
    assert alice.completed_flows() == [handle.flow_id]
    (pong,) = bob.completed_flows(PongFlow)
    assert bob.flow_result(pong) == "Ping"
    assert bob.checkpoints() == []


def test_no_marker_means_no_cordapps(mock_network):
    assert mock_network.cordapps == ()
    alice = mock_network.create_node(ALICE, cordapps=["samples.pingpong"])
    bob = mock_network.create_node(BOB, cordapps=["samples.pingpong"])
    handle = alice.start_flow(PingFlow(bob.party))
    mock_network.run_network()
    assert handle.result() == "Pong"


@pytest.mark.cordapps("samples.pingpong")
def test_two_networks_with_options(mock_network_factory):
    faulty = mock_network_factory(faults=Faults(duplicate=0.5, reorder=0.5), seed=7)
    other = mock_network_factory(cordapps=["samples.trade"])
    assert isinstance(faulty, MockNetwork) and faulty.cordapps == ("samples.pingpong",)
    assert other.cordapps == ("samples.trade",)
    assert faulty.directory != other.directory
    alice = faulty.create_node(ALICE)
    bob = faulty.create_node(BOB)
    handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(5)]
    faulty.run_network()
    assert [h.result() for h in handles] == ["Pong"] * 5
    assert len(bob.completed_flows(PongFlow)) == 5
    assert faulty.messaging.statistics.duplicated > 0


@pytest.mark.cordapps("samples.pingpong")
def test_completed_flows_on_the_memory_store(mock_network_factory):
    network = mock_network_factory(database="memory")
    alice = network.create_node(ALICE)
    bob = network.create_node(BOB)
    handles = [alice.start_flow(PingFlow(bob.party)) for _ in range(3)]
    network.run_network()
    assert alice.completed_flows(PingFlow) == [h.flow_id for h in handles]
    assert alice.completed_flows(PongFlow) == []
    assert len(bob.completed_flows()) == len(bob.completed_flows(PongFlow)) == 3
"""


def test_user_tests_pass(pytester: pytest.Pytester) -> None:
    result = run(pytester, USER_TESTS)
    result.assert_outcomes(passed=5)


STOPPED = """
import pytest

NETWORKS = []


@pytest.mark.cordapps("samples.pingpong")
def test_make(mock_network, mock_network_factory):
    NETWORKS.extend([mock_network, mock_network_factory()])
    for index, network in enumerate(NETWORKS):
        network.create_node(f"O=Node{index},L=London,C=GB")


def test_stopped_after_the_test():
    assert len(NETWORKS) == 2
    for network in NETWORKS:
        (mock,) = network.nodes
        assert mock.node._stopped  # Node.stop() ran
"""


def test_networks_are_stopped_after_the_test(pytester: pytest.Pytester) -> None:
    result = run(pytester, STOPPED)
    result.assert_outcomes(passed=2)


UNKNOWN_CORDAPP = """
import pytest

@pytest.mark.cordapps("samples.pingpnog")
def test_ping(mock_network):
    raise AssertionError("never reached")
"""


def test_unknown_cordapp_is_a_setup_error_naming_it(pytester: pytest.Pytester) -> None:
    result = run(pytester, UNKNOWN_CORDAPP)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*mock_network: cordapp module 'samples.pingpnog' cannot be imported*"]
    )
    result.stdout.no_fnmatch_line("*never reached*")


BAD_MARKERS = """
import pytest

@pytest.mark.cordapps()
def test_empty(mock_network):
    pass

@pytest.mark.cordapps(["samples.pingpong"])
def test_list(mock_network):
    pass

def test_string(mock_network_factory):
    mock_network_factory(cordapps="samples.pingpong")
"""


def test_bad_cordapps_say_what_is_wrong(pytester: pytest.Pytester) -> None:
    result = run(pytester, BAD_MARKERS)
    result.assert_outcomes(errors=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.cordapps() names no module*",
            "*@pytest.mark.cordapps takes module names (strings), not ?'samples.pingpong'?*",
            "*cordapps must be a list of module names, not the string 'samples.pingpong'*",
        ],
        consecutive=False,
    )


MISSPELLED_CRASH_POINT = """
import pytest
from samples.pingpong import PingFlow

@pytest.mark.cordapps("samples.pingpong")
def test_crash(mock_network):
    bob = mock_network.create_node("O=Bob,L=New York,C=US")
    bob.crash_at("after_comit")
"""


def test_misspelled_crash_point_fails_listing_the_points(pytester: pytest.Pytester) -> None:
    result = run(pytester, MISSPELLED_CRASH_POINT)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*ValueError: no crash point 'after_comit' (it would never fire)*after_commit*"]
    )


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.cordapps(*modules): the CorDapp modules*"])
