"""The one node assembly: a :class:`~flows.config.node.NodeConfig` and a transport become a Node.

:func:`build_node` is the only place a :class:`~flows.node.node.Node` is put together: the
node process (:mod:`flows.process`), the test network (:mod:`flows.testing`, and so the
in-process demo) and tests that need a node of their own all call it. What differs between
them is handed in: the transport, the clock, the crash hook, the lease, the hospital, the
relay (on its own thread, or the peer-to-peer bridges) and the instruments.

Everything that depends on the node's configuration is made here, once, and handed to what
needs it: the session codec (its limits) to the manager, the payload serializer (the same
limits) and the payload limit to the fibers, the message authenticator to the outbox relay,
the verifier to the inbound path (both from the identity and the peers' keys, sharing the
node's per-peer keys). Nothing process-wide is configured, so nodes with different limits
can share a process.

For a node process, :func:`node_transport` opens the transport its config names (and the
inbounds it moved away from) and :func:`bridge_relay` the peer-to-peer topology's relay.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from flows.config.node import NodeConfig
from flows.config.runtime import RuntimeConfig
from flows.cordapps import Cordapps
from flows.network.identity import Counterparties, NodeIdentity, PeerKeys
from flows.network.map import NetworkMap
from flows.network.peer_directory import NetworkMapDirectory
from flows.node.busy import BusyMonitor
from flows.node.effects import FlowEffectRegistry
from flows.node.external_operations import ExternalOperations
from flows.node.fiber import GreenletFiberFactory
from flows.node.flow_requests import FlowRequestIntake
from flows.node.instruments import NodeInstruments
from flows.node.node import Node, log_flow_failure
from flows.node.resident_memory import resident_bytes
from flows.node.schedules import FlowScheduler
from flows.party import Party
from foundation.engine import application_name
from foundation.serialization import PAYLOADS
from messaging.authentication import MessageAuthenticator, MessageVerifier
from messaging.background_relay import BackgroundOutboxRelay
from messaging.bridges import BridgeManager
from messaging.codec import SessionCodec
from messaging.inbound_path import InboundPath
from messaging.inbound_set import InboundSet
from messaging.outbox_relay import OutboxRelay
from messaging.pair_keys import PairKeyCache
from messaging.relay import OutboxStore, Relay
from messaging.service import MessagingService
from messaging.transports import open_transport
from persistence.lease import NodeLease
from persistence.memory_store import MEMORY_URL, InMemoryStore
from persistence.store import NodeDatabase
from persistence.worker_process import WorkerInfo
from statemachine.hibernation import HibernationPolicy
from statemachine.manager import StateMachineManager
from statemachine.ports import CheckpointStore, Clock, FailurePolicy, FiberFactory

RelayFactory = Callable[[OutboxStore, MessageAuthenticator], Relay]
"""Builds a node's outbox relay from its outbox and its message authenticator."""


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()


def build_node(
    config: NodeConfig,
    transport: MessagingService,
    *,
    identity: NodeIdentity,
    peers: PeerKeys,
    clock: Clock | None = None,
    on_boundary: Callable[[str], None] | None = None,
    background_relay: bool = False,
    lease: NodeLease | None = None,
    hospital: FailurePolicy | None = None,
    busy: BusyMonitor | None = None,
    relay_factory: RelayFactory | None = None,
    instruments: NodeInstruments | None = None,
) -> Node:
    """The node ``config`` describes, on ``transport``, built but not started.

    ``identity`` and ``peers`` (the peers' agreement keys) give the per-peer keys that tag
    every message the node sends and check every message it receives
    (:mod:`messaging.authentication`). ``on_boundary`` is called at every crash point (the
    test network's crashes). The test network drives everything from one thread
    (``background_relay=False``); a node process runs the outbox relay on its own thread, so
    the scheduler never waits for the transport.

    ``lease`` is the process's (already acquired) lease on the node database; without one,
    :meth:`Node.start` acquires a lease of its own and :meth:`Node.stop` releases it. Either
    way every write of the node's flows is fenced by it (:mod:`persistence.lease`).

    ``hospital`` decides about failures pinned on one flow or one message (a node process
    passes its :class:`~flows.node.hospital.Hospital`); without one, such errors propagate
    from :meth:`Node.run_once` (what a test wants to see). ``busy`` is the monitor of which
    flow's code runs now (a node process keeps one across rebuilds of its node).

    ``relay_factory`` builds the outbox relay from the outbox and the authenticator instead (the
    peer-to-peer topology's bridges: :func:`bridge_relay`). ``instruments`` observe the node
    (:mod:`flows.node.instruments`: the Prometheus metrics of :mod:`flows.metrics`); without
    them the node runs no hook at all.
    """
    if identity.name != config.name:
        raise ValueError(f"node {config.name}: its identity is {identity.name!r}")
    if transport.my_address != config.name:
        raise ValueError(
            f"node {config.name}: its transport address is {transport.my_address!r}; "
            "they must be the same"
        )
    clock = clock or SystemClock()
    party = Party(config.name)
    pair_keys = PairKeyCache(identity, peers)
    authenticator = MessageAuthenticator(pair_keys)
    codec = SessionCodec(config.limits)
    payloads = PAYLOADS.with_limits(config.limits)
    cordapps = Cordapps(config.cordapps)
    worker = lease.worker if lease is not None else WorkerInfo.of_this_process()
    database: NodeDatabase | InMemoryStore = (
        InMemoryStore()
        if config.database_url == MEMORY_URL
        else NodeDatabase(
            config.database_url,
            synchronous=config.synchronous,
            schema_name=config.database_schema,
            mac_key=identity.mac_key(),
            application_name=application_name(worker.worker_id),
        )
    )
    relay: Relay
    if relay_factory is not None:
        relay = relay_factory(database.outbox, authenticator)
    elif background_relay:
        relay = BackgroundOutboxRelay(
            transport,
            database.outbox,
            authenticator=authenticator,
            deletes=database.outbox,  # the rows taken ride in the next transaction
        )
    else:
        relay = OutboxRelay(transport, database.outbox, on_boundary, authenticator=authenticator)
    wakeup = threading.Event()
    inbound = InboundPath(transport, MessageVerifier(pair_keys), wakeup.set, f"node {party}")
    busy = busy or BusyMonitor()
    effects = FlowEffectRegistry(busy)
    operations = ExternalOperations(
        payloads,
        threads=config.operation_threads,
        max_result_bytes=codec.max_payload_bytes,
        wake=wakeup.set,
    )
    counterparties = Counterparties(config.name, peers)
    fibers = GreenletFiberFactory(
        party,
        clock.now,
        cordapps.flow_class,
        effects,
        config.receive_timeout,
        busy,
        payloads=payloads,
        max_payload_bytes=codec.max_payload_bytes,
        operations=operations,
        unknown_party=counterparties.problem,
    )
    store: CheckpointStore = database.checkpoints
    fiber_factory: FiberFactory = fibers
    if instruments is not None:
        store = instruments.checkpoint_store(store)
        fiber_factory = instruments.fibers(fibers)
    manager = StateMachineManager(
        our_identity=config.name,
        store=store,
        codec=codec,
        outbound=relay,
        fibers=fiber_factory,
        responders=cordapps,
        acknowledge=inbound.acknowledge,
        clock=clock,
        on_boundary=on_boundary,
        effects=effects,
        failures=hospital,
        operations=operations,
        hibernation=HibernationPolicy(
            idle_seconds=config.hibernate_after,
            memory_budget_bytes=(
                None if config.memory_budget_mb is None else config.memory_budget_mb << 20
            ),
            resident_bytes=resident_bytes,
        ),
        compatibility=cordapps.compatibility_problem,
    )
    manager.add_end_listener(lambda end: effects.forget(end.flow_id))
    manager.add_end_listener(log_flow_failure)
    inbound.connect(manager)
    schedules = database.schedules
    node = Node(
        config,
        identity=identity,
        peers=peers,
        counterparties=counterparties,
        pair_keys=pair_keys,
        authenticator=authenticator,
        codec=codec,
        payloads=payloads,
        clock=clock,
        cordapps=cordapps,
        worker=worker,
        lease=lease,
        database=database,
        messaging=transport,
        inbound=inbound,
        relay=relay,
        wakeup=wakeup,
        busy=busy,
        effects=effects,
        operations=operations,
        manager=manager,
        flow_requests=FlowRequestIntake(
            party=party,
            control=database.control,
            manager=manager,
            cordapps=cordapps,
            clock=clock,
            hospital=hospital,
        ),
        scheduler=None if schedules is None else FlowScheduler(schedules, clock.now),
        hospital=hospital,
        after_round=None if instruments is None else instruments.after_round,
    )
    if instruments is not None:
        instruments.bind(node)
    return node


def node_transport(config: RuntimeConfig, consumer_id: str) -> MessagingService:
    """The transport a node process's ``config`` names, as consumer ``consumer_id``.

    With ``former_inbounds`` (a peer-to-peer node that moved its inbound), one transport that
    also drains the inbounds it moved away from (:class:`~messaging.inbound_set.InboundSet`).
    """
    settings = config.tls_settings()
    heartbeat = consumer_heartbeat(config.lease_seconds)

    def open_url(url: str) -> MessagingService:
        return open_transport(
            settings.libpq_url(url),
            config.name,
            consumer_id=consumer_id,
            tls=settings.context,
            heartbeat=heartbeat,
        )

    transport = open_url(config.transport_url)
    if config.former_inbounds:
        transport = InboundSet(transport, [open_url(url) for url in config.former_inbounds])
    return transport


def bridge_relay(config: RuntimeConfig, network_map: NetworkMap) -> RelayFactory:
    """The peer-to-peer relay: a bridge per peer, to the inbound it published."""
    directory = NetworkMapDirectory(network_map)

    def build(outbox: OutboxStore, authenticator: MessageAuthenticator) -> Relay:
        return BridgeManager(
            outbox,
            directory,
            config.name,
            authenticator=authenticator,
            credentials=config.bridge_credentials,
            tls=config.tls_settings().context,
            libpq_tls=config.tls_settings().libpq_url,
            require_tls=config.require_tls,
        )

    return build


def consumer_heartbeat(lease_seconds: float) -> int:
    """The AMQP heartbeat of a node process's consumer: a quarter of its lease, at least 2 s.

    A process frozen past its lease must not keep the deliveries the broker pushed to it:
    the broker closes a connection silent for about its heartbeat and gives them to the
    worker that took the partitions over (the broker's default, 60 s, would hold them up
    to three minutes).
    """
    return max(2, round(lease_seconds / 4))
