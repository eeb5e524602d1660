"""Bounded load generator for the pre-fork demo service: a fixed mix of /health, /items and /report.

A few threads share one request schedule: request ``i`` is due at
``start + i / rps``, so the total rate is ``--rps`` whatever the number of
threads. The endpoint of request ``i`` follows a fixed 10-request pattern
(4 ``/health``, 3 ``/items``, 3 ``/report``), so runs are reproducible.
Generation stops after ``--seconds`` (at most ``rps * seconds`` requests).

At the end it prints one JSON line: requests per endpoint, errors per
endpoint, and how many ``/report`` requests each worker pid served (the
workers that served reports are the ones that grow). Exit code 0 when every
request succeeded, 1 otherwise.

Run::

    python loadgen.py --port 8000 --seconds 15 --rps 60
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from collections import Counter

#: Endpoint of request ``i`` is ``PATTERN[i % len(PATTERN)]``.
PATTERN = ("health", "items", "report", "health", "items", "health", "report", "items", "health", "report")

#: Per-request socket timeout, in seconds.
REQUEST_TIMEOUT_SECONDS = 10.0

#: Distinct customer ids cycled through by ``/report`` requests.
CUSTOMERS = 50


def request_path(index: int) -> tuple[str, str]:
    """Return ``(endpoint, path)`` of request number ``index``."""
    endpoint = PATTERN[index % len(PATTERN)]
    if endpoint == "items":
        return endpoint, f"/items?n={200 + index % 800}"
    if endpoint == "report":
        return endpoint, f"/report?customer=c{index % CUSTOMERS:03d}"
    return endpoint, "/health"


class LoadGenerator:
    """Shared schedule and counters of one load run; ``run()`` drives the worker threads."""

    def __init__(self, port: int, seconds: float, rps: float, threads: int) -> None:
        """Configure a run against ``127.0.0.1:port`` for ``seconds`` at ``rps`` requests/s over ``threads`` threads."""
        self.port = port
        self.seconds = seconds
        self.rps = rps
        self.threads = threads
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.reports_by_pid: Counter[str] = Counter()
        self._next_index = 0
        self._lock = threading.Lock()
        self._start = 0.0

    def wait_ready(self, timeout_seconds: float) -> bool:
        """Poll ``/health`` until it answers 200 or ``timeout_seconds`` pass; return whether it answered."""
        give_up = time.monotonic() + timeout_seconds
        while time.monotonic() < give_up:
            try:
                status, _body = self._get("/health")
                if status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def run(self) -> None:
        """Send the scheduled requests from ``threads`` threads until ``seconds`` have passed."""
        self._start = time.monotonic()
        workers = [threading.Thread(target=self._worker, name=f"loadgen-{n}", daemon=True) for n in range(self.threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def _claim(self) -> tuple[int, float] | None:
        """Take the next request index and its due time, or None once the run is over."""
        with self._lock:
            index = self._next_index
            due = self._start + index / self.rps
            if due >= self._start + self.seconds:
                return None
            self._next_index += 1
            return index, due

    def _worker(self) -> None:
        while (claim := self._claim()) is not None:
            index, due = claim
            time.sleep(max(0.0, due - time.monotonic()))
            endpoint, path = request_path(index)
            try:
                status, body = self._get(path)
                ok = status == 200
            except OSError:
                ok, body = False, b""
            with self._lock:
                if not ok:
                    self.errors[endpoint] += 1
                    continue
                self.requests[endpoint] += 1
                if endpoint == "report":
                    self.reports_by_pid[str(json.loads(body)["pid"])] += 1

    def _get(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` on a fresh connection; return ``(status, body)``. Raises OSError on network errors."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_SECONDS)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the load generator's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="service port on 127.0.0.1")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long to send requests (default 15)")
    parser.add_argument("--rps", type=float, default=60.0, help="total requests per second (default 60)")
    parser.add_argument("--threads", type=int, default=4, help="client threads (default 4)")
    parser.add_argument("--ready-timeout", type=float, default=10.0,
                        help="seconds to wait for /health before giving up (default 10)")
    args = parser.parse_args(argv)
    if args.rps <= 0 or args.seconds < 0 or args.threads < 1:
        parser.error("--rps must be > 0, --seconds >= 0, --threads >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run one bounded load and print its JSON summary; return the exit code."""
    args = parse_args(argv)
    load = LoadGenerator(args.port, args.seconds, args.rps, args.threads)
    if not load.wait_ready(args.ready_timeout):
        print(json.dumps({"event": "loadgen_failed", "reason": f"no /health answer on port {args.port}"}), flush=True)
        return 1
    started = time.monotonic()
    try:
        load.run()
    except KeyboardInterrupt:
        pass
    summary = {
        "event": "loadgen_done",
        "seconds": round(time.monotonic() - started, 3),
        "requests": dict(sorted(load.requests.items())),
        "errors": dict(sorted(load.errors.items())),
        "reports_by_pid": dict(sorted(load.reports_by_pid.items())),
    }
    print(json.dumps(summary), flush=True)
    return 1 if load.errors or not load.requests else 0


if __name__ == "__main__":
    sys.exit(main())
