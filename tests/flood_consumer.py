"""A SQL queue consumer in a process of its own, reporting how much memory it took.

``python -m tests.flood_consumer URL QUEUE COUNT`` consumes ``QUEUE`` until ``COUNT`` messages
were delivered (acknowledging each), then prints one JSON line: the message ids delivered, the
frames it dead-lettered, its resident set size once ready to consume (``baseline_kib``) and
its peak resident set size over its whole life (``peak_kib``, from ``getrusage``). Used by
``tests/process/test_sqlqueue_flooding.py`` to check that a huge row is never loaded.

The peak is the kernel's high-water mark of the resident set (``VmHWM``), reset just before
consuming starts where the kernel allows it (``/proc/self/clear_refs``); ``getrusage``'s
``ru_maxrss`` would not do, as it keeps the peak of the process that forked this one.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time

from messaging.service import Message
from messaging.sqlqueue import SqlQueueMessaging

TOPIC = "flood.topic"
TIMEOUT_SECONDS = 120.0


def status_kib(field: str) -> int:
    """A size from ``/proc/self/status`` (``VmRSS``, ``VmHWM``), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> bool:
    """Reset the resident set high-water mark to the current size; False if not allowed."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
        return True
    return False


def main(url: str, queue: str, count: int) -> None:
    """Consume ``count`` messages of ``queue`` and print the report."""
    consumer = SqlQueueMessaging(url, queue, synchronous="NORMAL")
    delivered: list[str] = []
    done = threading.Event()

    def handle(message: Message) -> None:
        delivered.append(message.message_id)
        consumer.acknowledge(message)
        if len(delivered) >= count:
            done.set()

    consumer.add_handler(TOPIC, handle)
    reset = reset_peak()
    baseline = status_kib("VmRSS")
    started = time.monotonic()
    consumer.start()
    finished = done.wait(TIMEOUT_SECONDS)
    consumer.stop()
    report = {
        "finished": finished,
        "seconds": round(time.monotonic() - started, 2),
        "delivered": delivered,
        "dead_lettered": consumer.dead_lettered,
        "baseline_kib": baseline,
        "peak_kib": status_kib("VmHWM"),
        "peak_reset": reset,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
