"""The analytics checks on 1 and 10 million synthetic checkpoint rows: Spark against plain SQL.

Generates two node databases (Alice and Bob, SQLite, the real schema made by
``NodeDatabase``) holding ``rows`` checkpoint rows between them: every pair is an Alice
flow and the Bob responder it opened a session with (Bob's flow id is the UUID5 the node
would give it), most waiting on a receive, some sleeping, runnable or in the hospital, with
the dedup ids of the messages they consumed and the session facts of every flow row (true
to those records), a few outbox rows and finished flows; a few anomalies (a deleted
responder, a message consumed twice, a lost dedup id, an old outbox row) so every check has
something to find. Two mixes: ``stress`` (~93% of the rows wait on a
receive and are stuck) and ``realistic`` (3% of the conversations waiting, most flows asleep,
as many finished flows as live ones); the databases are generated once and kept in
``--cache`` (/tmp/fiberflow-bench). Then it runs ``fiberflow analyze`` as a subprocess (wall
time from process start to exit: Python and Spark start-up, the read, every check, the text,
JSON and HTML reports; per-check times from the JSON report) and the same checks as plain
SQL on SQLite (the two files attached to one connection) in the same run, and prints the
time and the input rows per second of each check, and what each found (they must agree).

With ``--read export`` the analysis reads a Parquet export of the databases kept in
``--cache`` (made the first time, refreshed after: its cost is printed apart), as an operator
runs it with the export refreshed on its own schedule.

Run: ``python benchmarks/analytics.py [--rows 1000000 10000000] [--mix stress realistic]
[--read export]``.
Needs ``pip install -e '.[spark]'``, Java 17+, and for JDBC the Debian driver jars.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from persistence.analytics import CheckSettings
from persistence.analytics.checks import CHECKS
from persistence.analytics.checks.exactly_once_audit import GAPS_LISTED
from persistence.sql_transaction import session_facts_text
from persistence.store import NodeDatabase
from statemachine.session_facts import SessionFacts
from statemachine.session_ids import (
    MESSAGE_ID_PREFIX,
    RESPONDER_SUFFIX,
    SESSION_SEPARATOR,
    initiator_session_id,
    message_id,
    responder_flow_id,
    responder_session_id,
)

ALICE = "O=Alice,L=London,C=GB"
BOB = "O=Bob,L=Paris,C=FR"
START_MS = 1_800_000_000_000
SPAN_MS = 86_400_000
AS_OF_MS = START_MS + SPAN_MS + 3_600_000
SETTINGS = CheckSettings(as_of_ms=AS_OF_MS)
INITIATORS = ["app.Payment", "app.Settlement", "app.Onboarding", "app.Audit", "app.Report"]
ANOMALY_EVERY = 100_000
CHUNK = 100_000


MIXES = {
    # share of Alice's flows: waiting on a receive, asleep, runnable (the rest: hospitalized)
    "stress": (0.80, 0.90, 0.97),
    "realistic": (0.03, 0.95, 0.98),
}
"""The status mixes: ``stress`` (80% of the initiators and their responders wait on a
receive, all of them stuck: ~93% of the rows) and ``realistic`` (3% waiting, most asleep
until after *as of*, so not stuck; as many finished flows as live ones)."""


def _flow_rows(
    pairs: int, seed: int, mix: str = "stress"
) -> Iterator[tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[str, list[Any]]]]:
    """Chunks of (Alice rows, Bob rows, dedup/outbox rows) for ``pairs`` conversations."""
    receive_below, sleep_below, runnable_below = MIXES[mix]
    rng = random.Random(seed)
    step = (1 << 128) // max(1, pairs)
    for start in range(0, pairs, CHUNK):
        alice_rows, bob_rows = [], []
        extra: dict[str, list[Any]] = {"alice_ids": [], "bob_ids": [], "outbox": [], "gone": []}
        for i in range(start, min(pairs, start + CHUNK)):
            flow = f"{i * step + rng.randrange(step):032x}"
            session = initiator_session_id(flow, 0)
            back_session = responder_session_id(session)
            responder = responder_flow_id(ALICE, session)
            at = START_MS + i * SPAN_MS // pairs
            flow_class = INITIATORS[i % len(INITIATORS)]
            journal = min(400, int(rng.expovariate(1 / 12)) + 2)
            size = 400 + journal * 90 + rng.randrange(200)
            roll = rng.random()
            if roll < receive_below:
                status, on = "SUSPENDED", "Receive"
                waiting = json.dumps([{"session": session, "counterparty": BOB}])
            elif roll < sleep_below:
                status, on = "SUSPENDED", "Sleep"
                waiting = json.dumps({"until": AS_OF_MS + 3_600_000})
            elif roll < runnable_below:
                status, on, waiting = "RUNNABLE", None, None
            else:
                status, on, waiting = "HOSPITALIZED", None, None
            error = "failed 3 times in a row: TimeoutError" if status == "HOSPITALIZED" else None
            # the session facts each side's row keeps, true to the records below: Alice sent
            # the opening message (and the outbox row's message 1), Bob confirmed it (and, for
            # the gap, sent 1 and 2), each took in what the other's records say
            gap = i % ANOMALY_EVERY == 3
            mine = SessionFacts(session, 2 if i % 200 == 7 else 1, 3 if gap else 1, True)
            theirs = SessionFacts(back_session, 3 if gap else 1, 1, True)
            alice_rows.append(
                (
                    flow,
                    flow_class,
                    status,
                    None,
                    on,
                    waiting,
                    journal,
                    size,
                    error,
                    at,
                    at,
                    session_facts_text([mine]),
                )
            )
            back = json.dumps([{"session": back_session, "counterparty": ALICE}])
            bob_on = "Receive"
            if mix != "stress" and on != "Receive":  # the responder sleeps too
                bob_on, back = "Sleep", json.dumps({"until": AS_OF_MS + 3_600_000})
            bob_at = at + 5
            if i % ANOMALY_EVERY == 1:
                extra["gone"].append(responder)  # a deleted responder: an orphan
            else:
                bob_rows.append(
                    (
                        responder,
                        flow_class + "Responder",
                        "SUSPENDED",
                        None,
                        bob_on,
                        back,
                        1,
                        380 + rng.randrange(100),
                        None,
                        bob_at,
                        bob_at,
                        session_facts_text([theirs]),
                    )
                )
            extra["bob_ids"].append((message_id(session, 0), ALICE, back_session, 0, bob_at))
            extra["alice_ids"].append((message_id(back_session, 0), BOB, session, 0, bob_at + 3))
            if i % ANOMALY_EVERY == 2:  # consumed twice, under a second id
                extra["bob_ids"].append((uuid.uuid4().hex, ALICE, back_session, 0, bob_at))
            if gap:  # message 1 lost, 2 recorded: a gap
                extra["alice_ids"].append(
                    (message_id(back_session, 2), BOB, session, 2, bob_at + 9)
                )
            if i % 200 == 7:
                created = AS_OF_MS - 60_000 if i % ANOMALY_EVERY != 7 else AS_OF_MS - 3_600_000
                extra["outbox"].append((message_id(session, 1), BOB, b"x" * 64, created))
        yield alice_rows, bob_rows, extra


def generate(directory: Path, rows: int, seed: int = 7, mix: str = "stress") -> dict[str, Path]:
    """Two node databases with ``rows`` checkpoint rows between them (see the docstring)."""
    paths = {ALICE: directory / "alice.db", BOB: directory / "bob.db"}
    for path in paths.values():
        NodeDatabase(f"sqlite:///{path}", synchronous="OFF").close()
    connections = {name: sqlite3.connect(path) for name, path in paths.items()}
    for connection in connections.values():
        connection.execute("PRAGMA journal_mode=OFF")
        connection.execute("PRAGMA synchronous=OFF")
    alice, bob = connections[ALICE], connections[BOB]
    insert_cp = (
        "INSERT INTO node_checkpoints (flow_id, flow_class, status, progress_step, suspended_on,"
        " waiting_for, journal_length, checkpoint_bytes, error_message, created_at, updated_at,"
        " session_facts, checkpoint_version) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,1)"
    )
    insert_id = "INSERT INTO node_message_ids VALUES (?,?,?,?,?)"
    rng = random.Random(seed + 1)
    finished_share = 10 if mix == "stress" else 1  # one finished flow per 10 live, or per 1
    for alice_rows, bob_rows, extra in _flow_rows(rows // 2, seed, mix):
        alice.executemany(insert_cp, alice_rows)
        bob.executemany(insert_cp, bob_rows)
        insert_blob = "INSERT INTO node_checkpoint_blobs (flow_id, blob) VALUES (?, x'')"
        alice.executemany(insert_blob, [row[:1] for row in alice_rows])
        bob.executemany(insert_blob, [row[:1] for row in bob_rows])
        alice.executemany(insert_id, extra["alice_ids"])
        bob.executemany(insert_id, extra["bob_ids"])
        alice.executemany("INSERT INTO node_outbox VALUES (?,?,?,?)", extra["outbox"])
        for name, connection in connections.items():
            finished = len(alice_rows) // finished_share
            results = [  # flows that talked to no one: no session facts
                (uuid.UUID(int=rng.getrandbits(128)).hex, "app.Payment", b"ok", START_MS + k, "[]")
                for k in range(finished)
            ]
            connection.executemany("INSERT INTO node_flow_results VALUES (?,?,?,?,?)", results)
            failed = [
                (
                    uuid.UUID(int=rng.getrandbits(128)).hex,
                    "app.Settlement",
                    "flow_exception",
                    "flows.errors.FlowException",
                    f"refused by {name}",
                    START_MS + k,
                    None,
                    "[]",
                )
                for k in range(finished // 10)
            ]
            connection.executemany(
                "INSERT INTO node_flow_exceptions VALUES (?,?,?,?,?,?,?,?)", failed
            )
        for connection in connections.values():
            connection.commit()
    for connection in connections.values():
        connection.close()
    return paths


# --- the same checks in plain SQL on SQLite -------------------------------------------------

# The session-id grammar (statemachine/session_ids.py) in SQLite, for the untagged ids generated
# here, with "{s}" (a session), "{m}" (a message id), "{n}" (a node), "{q}" (a sequence number)
# left for str.format.
IS_RESPONDER = f"{{s}} LIKE '%{RESPONDER_SUFFIX}'"
SESSION_FLOW = f"substr({{s}}, 1, instr({{s}}, '{SESSION_SEPARATOR}') - 1)"
OUTBOX_SESSION = (
    f"substr(rtrim({{m}}, '0123456789'), {len(MESSAGE_ID_PREFIX) + 1}, "
    f"length(rtrim({{m}}, '0123456789')) - {len(MESSAGE_ID_PREFIX) + 1})"
)
PEER = (
    f"CASE WHEN {IS_RESPONDER} THEN substr({{s}}, 1, length({{s}}) - {len(RESPONDER_SUFFIX)}) "
    f"ELSE {{s}} || '{RESPONDER_SUFFIX}' END"
)
COUNTERPART = (
    f"CASE WHEN {IS_RESPONDER} THEN {SESSION_FLOW} ELSE responder_flow_id({{n}}, {{s}}) END"
)
INITIAL_ID = f"'{MESSAGE_ID_PREFIX}' || {{s}} || '-0'"
MESSAGE_ID = f"'{MESSAGE_ID_PREFIX}' || {{s}} || '-' || {{q}}"

KNOWN = """
CREATE TEMP TABLE known AS
SELECT node, flow_id, status FROM cp
UNION ALL SELECT node, flow_id, 'COMPLETED' FROM res
UNION ALL SELECT node, flow_id, 'FAILED' FROM exc;
CREATE INDEX known_key ON known(node, flow_id);
"""

WAITS = """
SELECT cp.node, cp.flow_id, cp.flow_class, cp.status, cp.updated_at,
       json_extract(j.value, '$.session') AS session_id,
       json_extract(j.value, '$.counterparty') AS counterparty
FROM cp, json_each(cp.waiting_for) j WHERE cp.suspended_on = 'Receive'
"""


def sql_checks(names: list[str]) -> dict[str, Callable[[sqlite3.Connection], int]]:
    """Each check as SQL; each function returns the number of result rows (its findings)."""
    p = {
        "as_of": AS_OF_MS,
        "stuck": AS_OF_MS - SETTINGS.stuck_after_ms,
        "outbox": AS_OF_MS - SETTINGS.outbox_after_ms,
        "grace": AS_OF_MS - SETTINGS.grace_ms,
    }
    nodes = "(" + ", ".join(f"'{name}'" for name in names) + ")"

    def rows(connection: sqlite3.Connection, script: str, query: str) -> int:
        connection.executescript("DROP TABLE IF EXISTS temp.known;" + script)
        return len(connection.execute(query, p).fetchall())

    def flow_counts(c: sqlite3.Connection) -> int:
        return rows(
            c,
            "",
            """SELECT node, flow_class, status, count(*) FROM (
                 SELECT node, flow_class, status FROM cp
                 UNION ALL SELECT node, flow_class, 'COMPLETED' FROM res
                 UNION ALL SELECT node, flow_class, 'FAILED' FROM exc)
               GROUP BY 1, 2, 3""",
        )

    def flows_over_time(c: sqlite3.Connection) -> int:
        return rows(
            c,
            "",
            """SELECT at / 3600000 * 3600000 AS bucket, status, count(*) FROM (
                 SELECT updated_at AS at, status FROM cp
                 UNION ALL SELECT completed_at, 'COMPLETED' FROM res
                 UNION ALL SELECT failed_at, 'FAILED' FROM exc)
               GROUP BY 1, 2""",
        )

    def stuck_flows(c: sqlite3.Connection) -> int:
        counterpart = COUNTERPART.format(s="w.session_id", n="w.node")
        return rows(
            c,
            KNOWN,
            f"""SELECT w.*, k.status FROM ({WAITS}) w
                LEFT JOIN known k ON k.node = w.counterparty AND k.flow_id = {counterpart}
                WHERE w.status != 'HOSPITALIZED' AND w.updated_at <= :stuck
                  AND NOT EXISTS (SELECT 1 FROM paused p
                                  WHERE p.node = w.node AND p.flow_id = w.flow_id)
                UNION ALL
                SELECT node, flow_id, flow_class, status, updated_at, NULL, NULL, NULL FROM cp
                WHERE status != 'HOSPITALIZED'
                AND NOT EXISTS (SELECT 1 FROM paused p
                                WHERE p.node = cp.node AND p.flow_id = cp.flow_id)
                AND (
                  (suspended_on = 'Sleep' AND json_extract(waiting_for, '$.until') <= :stuck)
                  OR (suspended_on = 'Operation'
                      AND coalesce(json_extract(waiting_for, '$.until'), updated_at) <= :stuck)
                  OR (status IN ('UNSTARTED', 'RUNNABLE') AND updated_at <= :stuck))""",
        )

    def session_consistency(c: sqlite3.Connection) -> int:
        session = OUTBOX_SESSION.format(m="message_id")
        counterpart = COUNTERPART.format(s="e.session_id", n="e.node")
        own = SESSION_FLOW.format(s="e.session_id")
        responder = IS_RESPONDER.format(s="e.session_id")
        initial = INITIAL_ID.format(s="e.session_id")
        return rows(
            c,
            KNOWN,
            f"""WITH ends AS (
                  SELECT node, session_id, counterparty, min(at) AS since FROM (
                    SELECT node, session_id, counterparty, updated_at AS at FROM ({WAITS})
                    UNION ALL SELECT node, session_id, sender, inserted_at FROM ids
                    UNION ALL SELECT node, {session}, target, created_at FROM outb)
                  GROUP BY 1, 2, 3)
                SELECT e.* FROM ends e
                WHERE e.counterparty IN {nodes}
                  AND NOT EXISTS (SELECT 1 FROM known k
                                  WHERE k.node = e.counterparty AND k.flow_id = {counterpart})
                  AND NOT (NOT {responder}
                           AND EXISTS (SELECT 1 FROM ids i WHERE i.node = e.counterparty
                                       AND i.message_id = {initial})
                           AND NOT EXISTS (SELECT 1 FROM ids r WHERE r.node = e.node
                                           AND r.session_id = e.session_id AND r.sequence > 0)
                           AND NOT EXISTS (SELECT 1 FROM cp WHERE cp.node = e.node
                                           AND cp.flow_id = {own}))
                  AND NOT (NOT {responder}
                           AND EXISTS (SELECT 1 FROM outb o WHERE o.node = e.node
                                       AND o.message_id = {initial}))
                  AND e.since <= :grace""",
        )

    def exactly_once_audit(c: sqlite3.Connection) -> int:
        expected = MESSAGE_ID.format(s=PEER.format(s="session_id"), q="sequence")
        return rows(
            c,
            "",
            f"""SELECT node, session_id, sequence FROM ids GROUP BY 1, 2, 3 HAVING count(*) > 1
                UNION ALL
                SELECT node, message_id, NULL FROM ids GROUP BY node, message_id
                HAVING count(DISTINCT session_id || '#' || sequence) > 1
                UNION ALL
                SELECT node, message_id, sequence FROM ids
                WHERE message_id != {expected}
                UNION ALL
                SELECT node, message_id, sequence FROM ids WHERE sequence < 0
                UNION ALL
                SELECT * FROM (
                  WITH RECURSIVE gaps AS (
                    SELECT node, session_id, sender, max(sequence) AS top,
                           count(DISTINCT sequence) AS size, max(inserted_at) AS at FROM ids
                    WHERE sequence >= 0
                    GROUP BY 1, 2, 3 HAVING max(sequence) >= count(DISTINCT sequence)
                  ), numbers(node, session_id, sender, n, top) AS (
                    SELECT node, session_id, sender, 0,
                           min(top, size + {GAPS_LISTED} - 1) FROM gaps WHERE at <= :grace
                    UNION ALL SELECT node, session_id, sender, n + 1, top FROM numbers
                    WHERE n < top)
                  SELECT n.node, n.session_id, n.n FROM numbers n
                  WHERE NOT EXISTS (SELECT 1 FROM ids i WHERE i.node = n.node
                                    AND i.session_id = n.session_id AND i.sequence = n.n))
                UNION ALL
                SELECT node, message_id, NULL FROM outb WHERE created_at <= :outbox""",
        )

    def checkpoint_costs(c: sqlite3.Connection) -> int:
        found = rows(
            c,
            "",
            """WITH ranked AS (
                 SELECT flow_class, checkpoint_bytes AS b, journal_length AS j,
                        row_number() OVER (PARTITION BY flow_class ORDER BY checkpoint_bytes)
                          AS rb,
                        row_number() OVER (PARTITION BY flow_class ORDER BY journal_length)
                          AS rj,
                        count(*) OVER (PARTITION BY flow_class) AS n FROM cp)
               SELECT flow_class, count(*), sum(b), avg(b), max(b), avg(j), max(j),
                      max(CASE WHEN rb = (n + 1) / 2 THEN b END),
                      max(CASE WHEN rb = (n * 9 + 9) / 10 THEN b END),
                      max(CASE WHEN rb = (n * 99 + 99) / 100 THEN b END),
                      max(CASE WHEN rj = (n * 9 + 9) / 10 THEN j END)
               FROM ranked GROUP BY flow_class""",
        )
        c.execute("SELECT * FROM cp ORDER BY checkpoint_bytes DESC LIMIT 10").fetchall()
        c.execute("SELECT * FROM cp ORDER BY journal_length DESC LIMIT 10").fetchall()
        c.execute(
            "SELECT CAST(log2(max(checkpoint_bytes, 1)) AS INTEGER) AS e, count(*) FROM cp "
            "GROUP BY e"
        ).fetchall()
        return found

    def failed_flows(c: sqlite3.Connection) -> int:
        return rows(
            c,
            "",
            """SELECT node, flow_class, outcome, exception_class, count(*), max(at), min(message)
               FROM (SELECT node, flow_class, 'HOSPITALIZED' AS outcome,
                            NULL AS exception_class, error_message AS message,
                            updated_at AS at FROM cp WHERE status = 'HOSPITALIZED'
                     UNION ALL SELECT node, flow_class, error_kind, exception_class, message,
                            failed_at FROM exc)
               GROUP BY 1, 2, 3, 4""",
        )

    def node_integrity(c: sqlite3.Connection) -> int:
        return rows(
            c,
            "",
            """WITH f AS (
                 SELECT node, flow_id, max(l) AS l, max(b) AS b, max(d) AS d, max(x) AS x FROM (
                   SELECT node, flow_id, 1 AS l, 0 AS b, 0 AS d, 0 AS x FROM cp
                   UNION ALL SELECT node, flow_id, 0, 1, 0, 0 FROM blobs
                   UNION ALL SELECT node, flow_id, 0, 0, 1, 0 FROM res
                   UNION ALL SELECT node, flow_id, 0, 0, 0, 1 FROM exc)
                 GROUP BY node, flow_id)
               SELECT * FROM f WHERE (l AND (d OR x)) OR (d AND x) OR (l AND NOT b)
                 OR (b AND NOT l)""",
        )

    def session_ownership(c: sqlite3.Connection) -> int:
        session = OUTBOX_SESSION.format(m="message_id")
        responder = IS_RESPONDER.format(s="g.session_id")
        peer = PEER.format(s="g.session_id")
        owner = (
            f"CASE WHEN {responder} THEN responder_flow_id(g.sender, {peer}) "
            f"ELSE {SESSION_FLOW.format(s='g.session_id')} END"
        )
        return rows(
            c,
            KNOWN,
            f"""WITH g AS (
                  SELECT node, session_id, sender, max(sequence) AS last FROM ids
                  GROUP BY 1, 2, 3),
                ends AS (
                  SELECT node, session_id, counterparty FROM ({WAITS})
                  UNION SELECT node, session_id, sender FROM ids
                  UNION SELECT node, {session}, target FROM outb),
                o AS (
                  SELECT g.*, {responder} AS responder,
                    EXISTS (SELECT 1 FROM ends e WHERE e.node = g.sender
                            AND e.session_id = {peer} AND e.counterparty != g.node) AS ev,
                    EXISTS (SELECT 1 FROM known k WHERE k.node = g.node
                            AND k.flow_id = {owner}) AS own
                  FROM g),
                s AS (
                  SELECT session_id, sender, count(*) AS n, sum(own) AS owners, max(ev) AS anyev
                  FROM o WHERE responder GROUP BY 1, 2 HAVING count(*) > 1)
                SELECT o.* FROM o LEFT JOIN s USING (session_id, sender)
                WHERE o.ev
                   OR (NOT o.own AND NOT (o.responder AND o.last = 0))
                   OR (o.responder AND s.n IS NOT NULL AND NOT s.anyev
                       AND NOT (o.own AND s.owners = 1))""",
        )

    return {
        "flow_counts": flow_counts,
        "flows_over_time": flows_over_time,
        "stuck_flows": stuck_flows,
        "session_consistency": session_consistency,
        "exactly_once_audit": exactly_once_audit,
        "checkpoint_costs": checkpoint_costs,
        "failed_flows": failed_flows,
        "node_integrity": node_integrity,
        "session_ownership": session_ownership,
    }


def sqlite_connection(paths: dict[str, Path]) -> sqlite3.Connection:
    """One connection with every node database attached and union views over them."""
    connection = sqlite3.connect(":memory:")
    connection.create_function(
        "responder_flow_id",
        2,
        responder_flow_id,
        deterministic=True,
    )
    tables = {
        "cp": "node_checkpoints",
        "blobs": "node_checkpoint_blobs",
        "res": "node_flow_results",
        "exc": "node_flow_exceptions",
        "ids": "node_message_ids",
        "outb": "node_outbox",
        "paused": "node_paused_flows",
    }
    views: dict[str, list[str]] = {view: [] for view in tables}
    for index, (name, path) in enumerate(paths.items()):
        connection.execute(f"ATTACH DATABASE ? AS n{index}", (str(path),))
        for view, table in tables.items():
            views[view].append(f"SELECT '{name}' AS node, * FROM n{index}.{table}")
    for view, selects in views.items():
        connection.execute(f"CREATE TEMP VIEW {view} AS " + " UNION ALL ".join(selects))
    return connection


def input_rows(paths: dict[str, Path]) -> int:
    """Rows of the tables the checks read, in every database."""
    total = 0
    for path in paths.values():
        with sqlite3.connect(path) as connection:
            for table in (
                "node_checkpoints",
                "node_checkpoint_blobs",
                "node_flow_results",
                "node_flow_exceptions",
                "node_message_ids",
                "node_outbox",
                "node_paused_flows",
            ):
                total += connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        connection.close()
    return total


GENERATOR_VERSION = 2
"""Bump when the generated data changes: cached databases of another version are rebuilt."""


def cached_databases(cache: Path, rows: int, mix: str) -> tuple[dict[str, Path], float]:
    """The databases of ``rows`` and ``mix`` in ``cache`` (generated once, then reused).

    Returns the paths and the seconds spent generating (0 when reused).
    """
    directory = cache / f"{mix}-{rows}"
    marker = directory / "generated.json"
    paths = {ALICE: directory / "alice.db", BOB: directory / "bob.db"}
    if marker.exists():
        made = json.loads(marker.read_text())
        if made.get("version") == GENERATOR_VERSION and all(p.exists() for p in paths.values()):
            return paths, 0.0
    directory.mkdir(parents=True, exist_ok=True)
    for path in paths.values():
        path.unlink(missing_ok=True)
    began = time.perf_counter()
    generate(directory, rows, mix=mix)
    seconds = time.perf_counter() - began
    marker.write_text(
        json.dumps({"rows": rows, "mix": mix, "seconds": seconds, "version": GENERATOR_VERSION})
    )
    return paths, seconds


def run_cli(
    paths: dict[str, Path],
    master: str,
    read: str,
    memory: str,
    out: Path,
    extra: Sequence[str] = (),
) -> tuple[float, dict[str, Any], int]:
    """``fiberflow analyze`` as a subprocess: (wall seconds from process start, JSON, status)."""
    fiberflow = Path(sys.executable).parent / "fiberflow"
    command = [str(fiberflow), "analyze", *extra]
    for name, path in paths.items():
        command += ["--node", f"{name}=sqlite:///{path}"]
    if "--export-only" in extra:
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the export exited {done.returncode}: {done.stderr[-2000:]}")
        return time.perf_counter() - began, {}, 0
    command += [
        "--as-of",
        str(AS_OF_MS),
        "--master",
        master,
        "--read",
        read,
        "--json",
        str(out / "report.json"),
        "--html",
        str(out / "report.html"),
        "--conf",
        f"spark.driver.memory={memory}",
    ]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode not in (0, 1):
        raise RuntimeError(f"fiberflow analyze exited {done.returncode}: {done.stderr[-2000:]}")
    (out / "stderr.txt").write_text(done.stderr)
    return wall, json.loads((out / "report.json").read_text()), done.returncode


def change_one_percent(paths: dict[str, Path], seed: int = 11) -> int:
    """Update, delete and insert checkpoint rows (1% of them) and add dedup ids (1%)."""
    rng = random.Random(seed)
    changed = 0
    for path in paths.values():
        with sqlite3.connect(path) as connection:
            total = connection.execute("SELECT count(*) FROM node_checkpoints").fetchone()[0]
            step = max(1, total // (total // 100 or 1))
            keys = [
                row[0]
                for row in connection.execute(
                    "SELECT flow_id FROM node_checkpoints WHERE rowid % ? = 0", (step,)
                )
            ]
            now = AS_OF_MS - 120_000
            half = len(keys) // 2
            connection.executemany(
                "UPDATE node_checkpoints SET status = 'RUNNABLE', suspended_on = NULL, "
                "waiting_for = NULL, checkpoint_version = checkpoint_version + 1, "
                "updated_at = ? WHERE flow_id = ?",
                [(now, key) for key in keys[:half]],
            )
            connection.executemany(
                "DELETE FROM node_checkpoints WHERE flow_id = ?", [(key,) for key in keys[half:]]
            )
            connection.executemany(
                "INSERT INTO node_checkpoints (flow_id, flow_class, status, journal_length, "
                "checkpoint_bytes, created_at, updated_at, checkpoint_version) "
                "VALUES (?, 'app.New', 'UNSTARTED', 1, 400, ?, ?, 1)",
                [(uuid.UUID(int=rng.getrandbits(128)).hex, now, now) for _ in keys[half:]],
            )
            connection.executemany(
                "INSERT INTO node_message_ids VALUES (?, ?, ?, 0, ?)",
                [(f"N-{uuid.uuid4().hex}.s0-0", BOB, f"{key}.s0.r", now) for key in keys],
            )
            changed += len(keys) + len(keys[half:])
        connection.close()
    return changed


def run_export(
    paths: dict[str, Path], master: str, memory: str, cache: Path, rows: int, mix: str
) -> None:
    """The export's cost: full, analyze from it, and incremental after 1% changed."""
    folder = cache / f"{mix}-{rows}-export"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    copies = {name: folder / path.name for name, path in paths.items()}
    for name, path in paths.items():
        shutil.copyfile(path, copies[name])
    target = folder / "parquet"
    extra = ["--export-dir", str(target)]
    full, _, _ = run_cli(copies, master, "auto", memory, folder, [*extra, "--export-only"])
    print(f"{'export (full)':<22}{full:>9.1f}  (fiberflow analyze --export-only, process wall)")
    wall, report, status = run_cli(copies, master, "auto", memory, folder, extra)
    print(
        f"{'analyze the export':<22}{wall:>9.1f}  (process wall, refresh included; load "
        f"{report['load_seconds']:.1f} s; checks "
        + ", ".join(f"{c['name']} {c['seconds']:.1f}" for c in report["checks"])
        + f"; exit {status})"
    )
    wall, report, status = run_cli(copies, master, "auto", memory, folder, [*extra, "--no-refresh"])
    print(
        f"{'analyze, no refresh':<22}{wall:>9.1f}  (process wall, the export as it is; load "
        f"{report['load_seconds']:.1f} s; checks "
        + ", ".join(f"{c['name']} {c['seconds']:.1f}" for c in report["checks"])
        + f"; exit {status})"
    )
    changed = change_one_percent(copies)
    again, _, _ = run_cli(copies, master, "auto", memory, folder, [*extra, "--export-only"])
    print(f"{'export (1% changed)':<22}{again:>9.1f}  ({changed:,} checkpoint rows changed)")
    shutil.rmtree(folder, ignore_errors=True)


def run(
    rows: int, mix: str, master: str, read: str, cache: Path, memory: str, export: bool
) -> None:
    """Generate (or reuse), run both ways, print one table."""
    paths, generated = cached_databases(cache, rows, mix)
    total = input_rows(paths)
    size = sum(path.stat().st_size for path in paths.values()) / 2**20
    made = f"generated in {generated:.1f} s" if generated else f"reused from {cache}"
    print(
        f"\n== {mix} mix, {rows:,} checkpoint rows ({total:,} rows in the tables read, "
        f"{size:,.0f} MiB), {made}; load average {os.getloadavg()[0]:.1f}"
    )
    extra: list[str] = []
    if read == "export":  # a Parquet export kept beside the databases, brought up to date
        kept = cache / f"{mix}-{rows}-parquet"
        fresh = not (kept / "manifest.json").exists()
        with tempfile.TemporaryDirectory(prefix="fiberflow-bench-export-") as folder:
            seconds, _, _ = run_cli(
                paths,
                master,
                "auto",
                memory,
                Path(folder),
                ["--export-dir", str(kept), "--export-only"],
            )
        print(
            f"{'full export' if fresh else 'export refresh'} {seconds:.1f} s (fiberflow analyze "
            f"--export-only --export-dir {kept}, process wall; not in the figures below)"
        )
        extra = ["--export-dir", str(kept), "--no-refresh"]
        read = "auto"
    with tempfile.TemporaryDirectory(prefix="fiberflow-bench-report-") as folder:
        wall, report, status = run_cli(paths, master, read, memory, Path(folder), extra)
    checks = {check["name"]: check for check in report["checks"]}
    print(f"Spark {report['spark']['version']} on {report['spark']['master']}, read: ", end="")
    print("; ".join(f"{n['name'].split(',')[0]} {n['detail']}" for n in report["nodes"]))
    connection = sqlite_connection(paths)
    sql_times: dict[str, float] = {}
    sql_found: dict[str, int] = {}
    for name, sql_check in sql_checks(list(paths)).items():
        started = time.perf_counter()
        sql_found[name] = sql_check(connection)
        sql_times[name] = time.perf_counter() - started
    connection.close()
    header = f"{'check':<22}{'Spark s':>9}{'rows/s':>13}{'SQLite s':>10}{'rows/s':>13}"
    print(header + f"{'found (Spark / SQL)':>22}")
    load = report["load_seconds"]
    print(f"{'load (snapshot+read)':<22}{load:>9.1f}{total / load:>13,.0f}")
    in_checks = 0.0
    for name, _ in CHECKS:
        check = checks[name]
        in_checks += check["seconds"]
        if name not in sql_found:  # checkpoint_blobs: no key here, and no SQL form (blobs)
            note = check["summary"][:40]
            print(f"{name:<22}{check['seconds']:>9.1f}{'':>13}{'-':>10}{'':>13}  {note}")
            continue
        found = f"{check['table']['total']} / {sql_found[name]}"
        print(
            f"{name:<22}{check['seconds']:>9.1f}{total / check['seconds']:>13,.0f}"
            f"{sql_times[name]:>10.1f}{total / sql_times[name]:>13,.0f}{found:>22}"
        )
    rest = wall - load - in_checks
    print(f"{'start, report, exit':<22}{rest:>9.1f}")
    sql_total = sum(sql_times.values())
    print(
        f"{'all (wall, process)':<22}{wall:>9.1f}{total / wall:>13,.0f}"
        f"{sql_total:>10.1f}{total / sql_total:>13,.0f}{'exit ' + str(status):>22}"
    )
    differ = [
        name
        for name, _ in CHECKS
        if name in sql_found and checks[name]["table"]["total"] != sql_found[name]
    ]
    if differ:
        print(f"Spark and SQL DISAGREE on {', '.join(differ)}")
    else:
        print("Spark and SQL found the same number of rows in every check")
    if export:
        run_export(paths, master, memory, cache, rows, mix)


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--mix", choices=sorted(MIXES), nargs="+", default=["stress", "realistic"])
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--read",
        choices=["auto", "jdbc", "arrow", "export"],
        default="auto",
        help="how analyze reads the nodes: JDBC, Arrow, auto (JDBC where a driver jar is "
        "found), or export: a Parquet export kept in --cache beside the databases (made or "
        "refreshed first, its cost printed apart), read with --no-refresh",
    )
    parser.add_argument("--driver-memory", default="10g", help="Spark driver memory (10g)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fiberflow-bench",
        help="where the generated databases are kept and reused (/tmp/fiberflow-bench)",
    )
    parser.add_argument(
        "--export",
        action="store_true",
        help="also time the Parquet export: full, analyze from it (with its refresh, and "
        "with --no-refresh), incremental after 1%% changed",
    )
    args = parser.parse_args()
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # each line as it comes, also in a log
    for rows in args.rows:
        for mix in args.mix:
            run(rows, mix, args.master, args.read, args.cache, args.driver_memory, args.export)


if __name__ == "__main__":
    main()
