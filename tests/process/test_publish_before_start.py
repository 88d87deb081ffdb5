"""A node publishes its node-info before it starts, so peers verify its re-sent outbox by it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select

from flows.config.runtime import RuntimeConfig
from flows.network.map import NetworkMap, NodeInfo, node_key
from persistence import schema
from persistence.store import NodeDatabase
from statemachine.session_ids import identity_tag, initiator_session_id, message_id
from tests.process.test_runtime import running
from tests.waiting import wait_until

ALICE, BOB = "O=Alice,L=London,C=GB", "O=Bob,L=Paris,C=FR"


def config(tmp_path: Path, name: str, short: str) -> RuntimeConfig:
    return RuntimeConfig(
        name=name,
        database_url=f"sqlite:///{tmp_path / (short + '.db')}",
        transport_url=f"sqlite:///{tmp_path / 'queue.db'}",
        cordapps=("samples.pingpong",),
        network_map=tmp_path / "network-map",
        synchronous="NORMAL",
        key_file=tmp_path / f"{short}.key.pem",
    )


def test_a_restarted_node_s_outbox_is_judged_by_its_new_node_info_not_refused_by_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Alice's entry on the map is one Bob refuses (an older fiberflow's, without the
    # agreement key: the upgrade docs/security.md describes), and a message for Bob waits in
    # her outbox. When she starts, her relay re-sends it at once: her node-info must be on
    # the map by then, or Bob dead-letters it as from an unknown sender, for good.
    alice, bob = config(tmp_path, ALICE, "alice"), config(tmp_path, BOB, "bob")
    with running([alice, bob]):
        pass  # both have their databases, queues and node-infos
    path = tmp_path / "network-map" / f"{node_key(ALICE)}.json"
    document = json.loads(path.read_text())
    del document["agreement_key"]
    path.write_text(json.dumps(document))
    session = initiator_session_id("ab" * 16, 0, identity_tag(ALICE))
    waiting = message_id(session, 0)
    alice_database = NodeDatabase(alice.database_url)
    with alice_database.engine.begin() as connection:
        connection.execute(
            insert(schema.node_outbox).values(
                message_id=waiting, target=BOB, payload=b"not a session message", created_at=0
            )
        )
    alice_database.close()
    publish = NetworkMap.publish

    def slow_publish(self: NetworkMap, info: NodeInfo, *args: Any, **kwargs: Any) -> Path:
        if info.name == ALICE:
            time.sleep(1.5)  # a slow file system: a start that overtakes it is seen
        return publish(self, info, *args, **kwargs)

    monkeypatch.setattr(NetworkMap, "publish", slow_publish)
    bob_database = NodeDatabase(bob.database_url)
    try:

        def dead_letters() -> list[tuple[str, str]]:
            table = schema.node_dead_letters
            with bob_database.engine.connect() as connection:
                rows = connection.execute(select(table.c.message_id, table.c.reason))
                return [(row.message_id, row.reason) for row in rows]

        with running([bob]), running([alice]):
            # The payload is no session message: Bob dead-letters it, and the reason says
            # whether he judged it by its content (Alice was known) or by its sender.
            wait_until(lambda: bool(dead_letters()), "Bob to judge Alice's message", 60)
        ((dead_id, reason),) = dead_letters()
        assert dead_id == waiting
        assert "sender" not in reason and "refused" not in reason, reason
    finally:
        bob_database.close()
