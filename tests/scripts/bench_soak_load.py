"""Soak load for ``cargo xtask bench --soak``: the demo's request mix, closed loop, for a fixed time.

``--threads`` client threads each send the next request as soon as the
previous one answered, for ``--seconds``, to the pre-fork demo service on
``127.0.0.1:--port``. Request ``i`` is the demo load generator's request
``i`` (``examples/prefork_service/loadgen.py``: 4 ``/health``, 3
``/items``, 3 ``/report`` in every 10), so the mix is the demo's while the
rate is as high as the service answers: the service's throughput.

Output: one JSON line ``{"event": "soak_load", "requests": N, "errors": E,
"seconds": S, "requests_per_second": N / S}``; exit code 1 when a request
failed or none was answered.

Run::

    python bench_soak_load.py --port 8000 --seconds 60 --threads 8
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "prefork_service"))

from loadgen import LoadGenerator, request_path  # noqa: E402 (after the path it is found on)


class ClosedLoop:
    """Request counter shared by the client threads of one closed-loop run."""

    def __init__(self, port: int, seconds: float) -> None:
        """Load ``127.0.0.1:port`` for ``seconds``."""
        self.client = LoadGenerator(port, seconds, rps=1.0, threads=1)
        self.seconds = seconds
        self.requests = 0
        self.errors = 0
        self._next = 0
        self._lock = threading.Lock()
        self._stop_at = 0.0

    def run(self, threads: int) -> float:
        """Send requests from ``threads`` threads until ``seconds`` passed; return the elapsed seconds."""
        started = time.monotonic()
        self._stop_at = started + self.seconds
        clients = [threading.Thread(target=self._client, daemon=True) for _ in range(threads)]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        return time.monotonic() - started

    def _claim(self) -> int | None:
        with self._lock:
            if time.monotonic() >= self._stop_at:
                return None
            index = self._next
            self._next += 1
            return index

    def _client(self) -> None:
        while (index := self._claim()) is not None:
            _endpoint, path = request_path(index)
            try:
                status, _body = self.client._get(path)
                ok = status == 200
            except OSError:
                ok = False
            with self._lock:
                if ok:
                    self.requests += 1
                else:
                    self.errors += 1


def main(argv: list[str] | None = None) -> int:
    """Run one closed-loop load and print its JSON line; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="service port on 127.0.0.1")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to send requests (default 60)")
    parser.add_argument("--threads", type=int, default=8, help="client threads (default 8)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.threads < 1:
        parser.error("--seconds must be > 0 and --threads >= 1")
    load = ClosedLoop(args.port, args.seconds)
    if not load.client.wait_ready(10.0):
        print(json.dumps({"event": "soak_load_failed", "reason": f"no /health answer on port {args.port}"}),
              flush=True)
        return 1
    elapsed = load.run(args.threads)
    print(json.dumps({
        "event": "soak_load",
        "requests": load.requests,
        "errors": load.errors,
        "seconds": round(elapsed, 3),
        "requests_per_second": round(load.requests / elapsed, 2),
    }), flush=True)
    return 1 if load.errors or not load.requests else 0


if __name__ == "__main__":
    sys.exit(main())
