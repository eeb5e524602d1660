"""Test workload (retention): a cache grows steadily while "traffic" is served, then the process idles holding it.

During ``--traffic-seconds`` seconds, :func:`remember` adds ``--mib-per-second``
MiB per second of distinct entries to the module-level dict ``_CACHE`` in
small paced steps (an unbounded cache keyed by request id). Then the process
idles ``--idle-seconds`` seconds without releasing anything.

Output (JSON lines, see ``workload_common.py``): ``{"event": "idle", "pid": ...,
"function": "remember", "entries": ..., "rss_bytes": ...}`` when traffic stops.

Run::

    python pattern_cache_retention.py --traffic-seconds 4 --mib-per-second 25 --idle-seconds 3
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import MIB, emit, rss_bytes

#: Payload bytes of each cached value (a repeated 8-digit number, so values differ).
VALUE_PAYLOAD_BYTES = 384

#: Pacing steps per second of traffic.
STEPS_PER_SECOND = 20

#: The cache that is never bounded: request id -> response.
_CACHE: dict[int, bytes] = {}


def remember(target_bytes: int) -> None:
    """Add distinct responses to ``_CACHE`` until ``target_bytes`` more (by ``sys.getsizeof``) are cached."""
    repeat = VALUE_PAYLOAD_BYTES // 8
    added = 0
    while added < target_bytes:
        key = len(_CACHE)
        value = (b"%08d" % key) * repeat
        _CACHE[key] = value
        added += sys.getsizeof(value)


def serve(traffic_seconds: float, bytes_per_second: int) -> None:
    """Serve paced "requests" for ``traffic_seconds``: each step caches its share of ``bytes_per_second``."""
    started = time.monotonic()
    steps = max(1, int(traffic_seconds * STEPS_PER_SECOND))
    for step in range(steps):
        remember(bytes_per_second // STEPS_PER_SECOND)
        time.sleep(max(0.0, started + (step + 1) / STEPS_PER_SECOND - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    """Serve, then idle holding the cache; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traffic-seconds", type=float, default=4.0, help="seconds of traffic (default 4)")
    parser.add_argument("--mib-per-second", type=float, default=25.0, help="cache growth per second (default 25)")
    parser.add_argument("--idle-seconds", type=float, default=3.0, help="seconds idle afterwards (default 3)")
    args = parser.parse_args(argv)
    serve(args.traffic_seconds, int(args.mib_per_second * MIB))
    emit("idle", function="remember", entries=len(_CACHE), rss_bytes=rss_bytes())
    time.sleep(args.idle_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
