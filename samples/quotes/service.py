"""A small HTTP quote service that honours idempotency keys (for the quotes sample and tests).

``GET /quote?symbol=ACME`` with an ``Idempotency-Key`` header answers a JSON quote. The first
call with a key does the work (draws a price, counts one *effective* call); a repeated call
with the same key gets the same answer and does nothing more. ``GET /stats`` answers the
counts: calls per key and effective calls per key. ``--delay`` slows every answer (so a test
can kill a node while its calls are in flight).

Run: ``python -m samples.quotes.service [--port 8765] [--delay 0.05]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuoteService:
    """The service: an HTTP server on the loopback address, run on a thread of its own."""

    def __init__(self, port: int = 0, delay: float = 0.0, seed: int | None = None) -> None:
        self.delay = delay
        self.calls: Counter[str] = Counter()
        """Calls per idempotency key, repeats included."""
        self.effective: Counter[str] = Counter()
        """Calls per key that did the work (1 each, if keys work)."""
        self._answers: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the service listens, e.g. ``http://127.0.0.1:8765``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> QuoteService:
        """Serve on a daemon thread; returns the service."""
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def quote(self, symbol: str, key: str) -> dict[str, Any]:
        """The answer for ``key``: drawn at its first call, the same for every repeat."""
        with self._lock:
            self.calls[key] += 1
            answer = self._answers.get(key)
            if answer is None:
                self.effective[key] += 1
                price = round(self._random.uniform(10, 500), 2)
                answer = {"symbol": symbol, "price": price, "key": key}
                self._answers[key] = answer
            return answer

    def stats(self) -> dict[str, Any]:
        """The counts, as ``GET /stats`` answers them."""
        with self._lock:
            return {"calls": dict(self.calls), "effective": dict(self.effective)}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                if url.path == "/stats":
                    self._answer(200, service.stats())
                    return
                if url.path != "/quote":
                    self._answer(404, {"error": f"no such path {url.path}"})
                    return
                symbol = urllib.parse.parse_qs(url.query).get("symbol", [""])[0]
                key = self.headers.get("Idempotency-Key", "")
                if not symbol or not key:
                    self._answer(400, {"error": "a symbol and an Idempotency-Key are required"})
                    return
                if service.delay:
                    time.sleep(service.delay)
                self._answer(200, service.quote(symbol, key))

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # The caller may have gone (a node killed mid-call): it will ask again.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: tests and the sample print what matters

        return Handler


def main() -> None:
    """Run the service until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args()
    service = QuoteService(args.port, args.delay)
    print(f"quote service on {service.url} (Ctrl-C stops it)", flush=True)
    try:
        service._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        service._server.server_close()


if __name__ == "__main__":
    main()
