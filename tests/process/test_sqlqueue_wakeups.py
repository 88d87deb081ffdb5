"""A send from another process wakes a SQLite queue's consumer by a datagram, not a poll."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from messaging.sqlqueue.wakeups import WakeListener, poke, wake_address

QUEUE = "O=Receiver,L=London,C=GB"

SEND_FROM_ANOTHER_PROCESS = """
import sys
from messaging.service import Message
from messaging.sqlqueue.broker import SqlQueueBroker
broker = SqlQueueBroker(sys.argv[1])
broker.enqueue([(Message("m-1", "test.topic", "O=Sender,L=Paris,C=FR", b"x"), sys.argv[2])])
broker.close()
"""


def test_a_commit_in_another_process_wakes_the_listener(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    from messaging.sqlqueue.broker import SqlQueueBroker

    SqlQueueBroker(url).create_queue(QUEUE)
    woken = threading.Event()
    listener = WakeListener(url, QUEUE, woken)
    listener.start()
    try:
        assert listener.listening
        subprocess.run(
            [sys.executable, "-c", SEND_FROM_ANOTHER_PROCESS, url, QUEUE],
            check=True,
            cwd=Path(__file__).resolve().parents[2],
            timeout=60,
        )
        assert woken.wait(10), "the sender's commit did not wake the consumer"
    finally:
        listener.stop()


def test_names_are_per_file_and_queue_and_free_again_after_stop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert wake_address(url, QUEUE) != wake_address(other, QUEUE)
    assert wake_address(url, QUEUE) != wake_address(url, "O=Else,L=Paris,C=FR")
    assert wake_address("postgresql://host/db", QUEUE) is None  # NOTIFY wakes those
    first, second = threading.Event(), threading.Event()
    listener = WakeListener(url, QUEUE, first)
    listener.start()
    rival = WakeListener(url, QUEUE, second)
    rival.start()
    assert listener.listening and not rival.listening  # one listener a queue; the other polls
    listener.stop()
    rival.start()
    try:
        assert rival.listening
        poke(url, QUEUE)
        assert second.wait(10)
    finally:
        rival.stop()
    poke(url, QUEUE)  # nobody listens: nothing happens, nothing raises
