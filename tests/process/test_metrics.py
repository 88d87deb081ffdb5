"""Prometheus metrics of a node (flows/metrics): every metric's value after known traffic."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path
from typing import Any

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flows.config.runtime import ConfigError, MetricsSettings, load_config
from flows.metrics import NodeMetrics, metrics_asgi_app
from flows.metrics.probe import NodeProbe
from flows.party import Party
from flows.process.process import EXIT_REFUSED, NodeProcess
from flows.testing import MockNetwork
from messaging.frame import encode_frame
from messaging.service import SESSION_TOPIC, Message
from samples.pingpong import PingFlow
from statemachine import session_messages
from tests.cordapp import FailingInitiator, SleepyFlow
from tests.malformed import ALICE, BOB, raw_frame
from tests.process.test_runtime import client_of, good_fields, running, two_nodes, write_config
from tests.unit.test_malformed_inbound import existing
from tests.waiting import wait_until

PING = "samples.pingpong.flows.PingFlow"
PONG = "samples.pingpong.flows.PongFlow"
SLEEPY = "tests.cordapp.SleepyFlow"


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and labels (parsed by prometheus_client)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """One sample's value (KeyError if the scrape does not have it)."""
    return samples[(name, tuple(sorted(labels.items())))]


def test_a_mock_network_counts_every_kind_of_flow_end_message_and_state(tmp_path: Path) -> None:
    with MockNetwork(["samples.pingpong", "tests.cordapp"], directory=tmp_path) as net:
        alice_metrics, bob_metrics = NodeMetrics(snapshot_seconds=0), NodeMetrics(0)
        alice = net.create_node(ALICE, metrics=alice_metrics)
        bob = net.create_node(BOB, metrics=bob_metrics)
        pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(3)]
        alice.run_once()  # Alice's initial messages are on Bob's queue: keep a copy of one
        copy = net.messaging.queued(BOB)[0]
        net.run_network()
        assert [p.result() for p in pings] == ["Pong"] * 3
        failing = alice.start_flow(FailingInitiator(bob.party, "flow_exception"))
        net.run_network()
        assert failing.done()
        killed, kept, paused = (alice.start_flow(SleepyFlow(3600)) for _ in range(3))
        net.run_network(advance_clock=False)
        alice.kill_flow(killed.flow_id)
        alice.node.keep_in_hospital(kept.flow_id, "kept by the test")
        alice.pause_flow(paused.flow_id)
        net.messaging.inject_raw(BOB, encode_frame(copy))  # a duplicate of a consumed message
        end = session_messages.SessionEnd()
        garbage = Message("N-wrong-1", SESSION_TOPIC, ALICE, existing("x.s0.r", -1, end))
        garbage = alice.node.authenticator.authenticate(garbage, BOB)
        net.messaging.inject_raw(BOB, raw_frame(garbage))  # dead-lettered by Bob's node
        net.run_network(advance_clock=False)

        a = scrape(alice_metrics.exposition().decode())
        b = scrape(bob_metrics.exposition().decode())
        failing_class = "tests.cordapp.FailingInitiator"
        assert value(a, "fiberflow_flows_started_total", flow_class=PING) == 3
        assert value(a, "fiberflow_flows_started_total", flow_class=failing_class) == 1
        assert value(a, "fiberflow_flows_started_total", flow_class=SLEEPY) == 3
        assert value(a, "fiberflow_flows_finished_total", flow_class=PING) == 3
        assert value(a, "fiberflow_flows_failed_total", flow_class=failing_class) == 1
        assert value(a, "fiberflow_flows_killed_total", flow_class=SLEEPY) == 1
        assert value(b, "fiberflow_flows_started_total", flow_class=PONG) == 3
        assert value(b, "fiberflow_flows_finished_total", flow_class=PONG) == 3
        responder = "tests.cordapp.FailingResponder"
        assert value(b, "fiberflow_flows_started_total", flow_class=responder) == 1
        assert value(b, "fiberflow_flows_failed_total", flow_class=responder) == 1
        # Alice: the kept and the paused sleeper are live, one of each.
        assert value(a, "fiberflow_flows_live") == 2
        assert value(a, "fiberflow_flows_hospitalized") == 1
        assert value(a, "fiberflow_flows_paused") == 1
        assert value(a, "fiberflow_flows_hibernated") == 0
        statistics = bob.node.manager.statistics
        assert value(b, "fiberflow_messages_duplicate_total") == 1 == statistics.duplicates_dropped
        assert value(b, "fiberflow_messages_dead_lettered_total") == 1 == statistics.dead_lettered
        assert value(b, "fiberflow_messages_received_total") == statistics.messages_received > 4
        assert value(a, "fiberflow_messages_sent_total") == alice.node.relay.handed_off >= 4
        assert value(a, "fiberflow_outbox_depth") == 0
        assert value(a, "fiberflow_outbox_oldest_age_seconds") == 0
        assert value(a, "fiberflow_node_ready") == 1
        # Every commit was timed; every checkpoint written was measured (SQLite: real blobs).
        commits = value(a, "fiberflow_checkpoint_commit_seconds_count")
        assert commits == alice.node.manager.executor.transactions > 0
        assert value(a, "fiberflow_checkpoint_commit_seconds_sum") > 0
        sizes = value(a, "fiberflow_checkpoint_size_bytes_count")
        assert sizes == alice.node.database.checkpoints.checkpoints_written > 0
        assert value(a, "fiberflow_checkpoint_size_bytes_bucket", le="+Inf") == sizes
        assert value(a, "fiberflow_replay_seconds_count") == 0

        # A restart: the sleepers are restored and replayed; counters carry on.
        received_before = value(a, "fiberflow_messages_received_total")
        alice.restart()
        alice.resume_flow(paused.flow_id)
        net.clock.advance(3601)
        net.run_network()
        assert paused.result() == pytest.approx(3601, abs=1)
        a = scrape(alice_metrics.exposition().decode())
        assert value(a, "fiberflow_replay_seconds_count") == 1  # (the kept one stays kept)
        assert value(a, "fiberflow_replay_seconds_sum") > 0
        assert value(a, "fiberflow_flows_finished_total", flow_class=SLEEPY) == 1
        assert value(a, "fiberflow_flows_started_total", flow_class=SLEEPY) == 3  # not again
        assert value(a, "fiberflow_messages_received_total") == received_before
        assert value(a, "fiberflow_flows_live") == 1
        assert value(a, "fiberflow_flows_hospitalized") == 1


def test_a_scrape_while_the_node_is_rebuilt_sees_the_counters_neither_drop_nor_jump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The metrics server scrapes on its own thread: one that lands while the replaced node's
    # final counts are taken must see the old node's totals, not the new node's (about 0),
    # which Prometheus would take for a counter reset.
    with MockNetwork(["samples.pingpong"], directory=tmp_path) as net:
        metrics = NodeMetrics(snapshot_seconds=0)
        alice = net.create_node(ALICE, metrics=metrics)
        bob = net.create_node(BOB)
        pings = [alice.start_flow(PingFlow(bob.party)) for _ in range(3)]
        net.run_network()
        assert [p.result() for p in pings] == ["Pong"] * 3
        names = ("fiberflow_messages_received_total", "fiberflow_messages_sent_total")

        def totals() -> tuple[float, float]:
            samples = scrape(metrics.exposition().decode())
            return value(samples, names[0]), value(samples, names[1])

        before = totals()
        assert before[0] > 0 and before[1] > 0
        during: list[tuple[float, float]] = []
        final_counters = NodeProbe.final_counters

        def scraped_meanwhile(probe: NodeProbe) -> tuple[int, int, int, int]:
            during.append(totals())  # what a scrape at this moment answers
            counters = final_counters(probe)
            during.append(totals())
            return counters

        monkeypatch.setattr(NodeProbe, "final_counters", scraped_meanwhile)
        alice.restart()
        assert during == [before, before]
        assert totals() == before


def test_the_outbox_gauges_show_rows_a_peer_has_not_taken(tmp_path: Path) -> None:
    with MockNetwork(["samples.pingpong"], directory=tmp_path) as net:
        metrics = NodeMetrics(snapshot_seconds=0)
        alice = net.create_node(ALICE, metrics=metrics)
        bob = net.create_node(BOB)
        # A row written and not yet sent: the manager's round alone does not flush the relay.
        alice.start_flow(PingFlow(bob.party))
        alice.node.manager.run_once()  # commits the row; the relay has not flushed yet
        net.clock.advance(42)
        samples = scrape(metrics.exposition().decode())
        assert value(samples, "fiberflow_outbox_depth") == 1
        assert value(samples, "fiberflow_outbox_oldest_age_seconds") == pytest.approx(42, abs=1)


def test_the_asgi_app_serves_the_registry() -> None:
    metrics = NodeMetrics()
    app = metrics_asgi_app(metrics)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/metrics",
        "query_string": b"",
        "headers": [],
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    assert value(scrape(body), "fiberflow_flows_live") == 0
    assert value(scrape(body), "fiberflow_node_ready") == 0  # no node built with it yet


def test_the_metrics_section_is_checked(tmp_path: Path) -> None:
    path = write_config(tmp_path / "node.toml", **good_fields(tmp_path))
    with path.open("a") as config_file:
        config_file.write("[metrics]\nport = 9464\n")
    assert load_config(path).metrics == MetricsSettings(port=9464, address="127.0.0.1")
    assert load_config(write_config(tmp_path / "n2.toml", **good_fields(tmp_path))).metrics is None
    for body, field in (
        ("port = 70000", "metrics.port"),
        ('port = "x"', "metrics.port"),
        ('address = "0.0.0.0"', "metrics.port"),
        ("port = 1\nhost = 2", "metrics.host"),
    ):
        bad = write_config(tmp_path / "bad.toml", **good_fields(tmp_path))
        with bad.open("a") as config_file:
            config_file.write(f"[metrics]\n{body}\n")
        with pytest.raises(ConfigError, match=f"field '{field}'"):
            load_config(bad)


def test_a_node_process_serves_its_metrics_over_http(tmp_path: Path) -> None:
    alice, bob, _ = two_nodes(tmp_path, "sqlite")
    alice = attrs.evolve(alice, metrics=MetricsSettings(port=0))
    client = client_of(alice)
    with running([alice, bob]) as processes:
        flow_ids = client.start_flows([PingFlow(Party(bob.name)) for _ in range(5)])
        client.wait(flow_ids, timeout=60)
        server = processes[0].metrics_server
        assert server is not None and processes[1].metrics_server is None
        url = f"http://127.0.0.1:{server.port}/metrics"

        def finished() -> float:
            with urllib.request.urlopen(url, timeout=10) as response:
                samples = scrape(response.read().decode())
            return value(samples, "fiberflow_flows_finished_total", flow_class=PING)

        wait_until(lambda: finished() == 5, "the scrape to show 5 finished pings", 30)
        with urllib.request.urlopen(url, timeout=10) as response:
            samples = scrape(response.read().decode())
        assert value(samples, "fiberflow_flows_started_total", flow_class=PING) == 5
        assert value(samples, "fiberflow_node_ready") == 1
        assert value(samples, "fiberflow_checkpoint_commit_seconds_count") > 0


def test_a_metrics_port_in_use_refuses_the_start_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alice, _, _ = two_nodes(tmp_path, "sqlite")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = attrs.evolve(alice, metrics=MetricsSettings(port=port))
        assert NodeProcess(config).run(install_signal_handlers=False) == EXIT_REFUSED
    refusals = [r.getMessage() for r in caplog.records if "refusing to start" in r.getMessage()]
    assert len(refusals) == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in refusals[0]
    assert "\n" not in refusals[0]
