"""One service exchange of `kiln.client` while other threads of its process run Python, as
on a first step (kiln's compiling threads lower graphs while exchanges fetch schedules and
binaries): with the client's short switch interval (`ServiceClient._once`,
compiler/runtime/gil.py) and without it (`ServiceClient._exchange` at the interpreter's
default), against a local server in another process answering JSON of each size.

    python -m bench.exchange_beside_python [--sizes 2000,300000,3000000] [--threads 2]

Prints the median of --repeat exchanges per size (ms): alone, beside the threads at the
default interval, beside them with the client's own.
"""

from __future__ import annotations

import argparse
import http.server
import json
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any


def _serve(port: int, ready: Any) -> None:
    class Answer(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            size = int(self.path.rsplit("/", 1)[-1])
            body = json.dumps({"x": "a" * size}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Answer)
    ready.set()
    server.serve_forever()


def _median_ms(exchange: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        exchange()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def main() -> int:
    from kiln.client import ServiceClient

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[2_000, 300_000, 3_000_000], help="answer sizes, bytes")
    parser.add_argument("--threads", type=int, default=2, help="threads running Python")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--port", type=int, default=47999)
    args = parser.parse_args()

    ready = multiprocessing.get_context("fork").Event()
    server = multiprocessing.get_context("fork").Process(target=_serve, args=(args.port, ready),
                                                         daemon=True)
    server.start()
    ready.wait(10)
    client = ServiceClient(f"http://127.0.0.1:{args.port}")
    running = threading.Event()
    running.set()

    def python_work() -> None:
        total = 0
        while running.is_set():
            for i in range(1000):
                total += i

    def exchange(size: int, short: bool) -> Callable[[], Any]:
        call = client._once if short else client._exchange
        return lambda: call("GET", f"/{size}", None, time.monotonic() + 30)

    rows = []
    try:
        for size in args.sizes:
            alone = _median_ms(exchange(size, True), args.repeat)
            workers = [threading.Thread(target=python_work, daemon=True)
                       for _ in range(args.threads)]
            for worker in workers:
                worker.start()
            rows.append((size, alone, _median_ms(exchange(size, False), args.repeat),
                         _median_ms(exchange(size, True), args.repeat)))
            running.clear()
            for worker in workers:
                worker.join()
            running.set()
    finally:
        server.terminate()
    print(f"one exchange, median of {args.repeat} (ms); beside {args.threads} threads "
          "running Python")
    print(f"{'answer bytes':>14}{'alone':>10}{'default':>12}{'short':>10}")
    for size, alone, plain, short in rows:
        print(f"{size:>14}{alone:>10}{plain:>12}{short:>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
