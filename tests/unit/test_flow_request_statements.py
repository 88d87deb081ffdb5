"""A batch of client flow requests costs the same few statements, whatever its size.

One query finds the pending requests and whether each id is a flow's already; the
transaction that starts their flows claims them with one update (flows/node/flow_requests.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from flows.node.flow_requests import encode_arguments
from flows.testing import MockNetwork, MockNode
from foundation.serialization import qualified_name
from persistence.node_store import FlowRequest
from samples.pingpong import PingFlow

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=New York,C=US"


@contextmanager
def statements_of(node: MockNode) -> Iterator[list[str]]:
    """The statements the node database runs inside the block (BEGINs on SQLite included)."""
    engine = node.node.database.engine  # type: ignore[union-attr]
    seen: list[str] = []

    def record(_: Any, __: Any, statement: str, *___: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _request(alice: MockNode, bob: MockNode, count: int) -> list[str]:
    requests = [
        FlowRequest(
            uuid.uuid4().hex, qualified_name(PingFlow), encode_arguments(PingFlow(bob.party))
        )
        for _ in range(count)
    ]
    alice.node.database.control.request_flows(requests, time.time())
    return [request.request_id for request in requests]


def test_starting_requested_flows_costs_the_same_statements_for_one_or_many(
    net: MockNetwork,
) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    counted = []
    for count in (1, 40):
        ids = _request(alice, bob, count)
        with statements_of(alice) as seen:
            assert alice.node.start_requested_flows() == count
        about_requests = [s for s in seen if "node_flow_requests" in s]
        assert len(about_requests) == 2, about_requests  # the query, and the claim
        assert about_requests[0].startswith("SELECT") and about_requests[1].startswith("UPDATE")
        counted.append(len(seen))
        net.run_network()
        assert [alice.node.flow_result(flow_id) for flow_id in ids] == ["Pong"] * count
    assert counted[0] == counted[1], "a batch's statements must not grow with its size"
    with statements_of(alice) as seen:
        assert alice.node.start_requested_flows() == 0
    assert len(seen) == 1, seen  # nothing pending: one query, no transaction


def test_a_request_whose_id_is_a_flow_already_is_only_claimed(net: MockNetwork) -> None:
    alice, bob = net.create_node(ALICE), net.create_node(BOB)
    (first,) = _request(alice, bob, 1)
    alice.node.start_requested_flows()
    net.run_network()
    alice.node.database.control.request_flows(  # asked again, after the row was claimed
        [FlowRequest(first, qualified_name(PingFlow), encode_arguments(PingFlow(bob.party)))],
        time.time(),
    )
    assert alice.node.start_requested_flows() == 0  # it is not pending: kept as it was
    handle = alice.start_flow(PingFlow(bob.party))
    net.run_network()
    alice.node.database.control.request_flows(  # a request naming a finished local flow
        [FlowRequest(handle.flow_id, qualified_name(PingFlow), b"")], time.time()
    )
    assert alice.node.start_requested_flows() == 0
    assert alice.node.database.control.pending_flow_requests(10) == []  # claimed all the same
    assert alice.node.flow_result(handle.flow_id) == "Pong"


def test_a_responder_class_cannot_be_requested(net: MockNetwork) -> None:
    """A responder runs when a peer opens a session; a request for one fails at once."""
    from flows.errors import FlowFailedError
    from samples.pingpong import PongFlow

    alice = net.create_node(ALICE)
    responder = PongFlow(None)  # type: ignore[arg-type]  (the issue's example)
    request = FlowRequest(uuid.uuid4().hex, qualified_name(PongFlow), encode_arguments(responder))
    alice.node.database.control.request_flows([request], time.time())
    alice.node.start_requested_flows()
    net.run_network()
    try:
        alice.node.flow_result(request.request_id)
    except FlowFailedError as error:
        assert "is a responder (@initiated_by PingFlow)" in str(error)
    else:
        raise AssertionError("a responder was started by a request")
