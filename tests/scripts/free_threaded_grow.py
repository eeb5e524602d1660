"""Test workload: grow ``--mib`` MiB in ``grow_rows`` on two threads at once (free-threaded CPython).

Two threads start together (each spins until both arrived: a
``threading.Barrier`` woke its waiter late, after the other thread had
finished) and each runs ``grow_rows``, which
appends distinct 400-byte ``bytes`` objects to a list kept until exit. On a
free-threaded build (``sys._is_gil_enabled()`` is False) both run Python
code at the same time.

Output (JSON lines, see ``workload_common.py``): ``{"event": "ready", "pid": ...,
"gil_enabled": <sys._is_gil_enabled()>}``, then, after ``--start-delay``
seconds, ``{"event": "grown", "pid": ..., "function": "grow_rows",
"rss_growth_bytes": <RSS after both threads minus RSS before>,
"getsizeof_bytes": <``sys.getsizeof`` of every row and of both lists>, "threads":
[{"native_id": ..., "start_ns": ..., "end_ns": ...}, ...]}`` (times from
``time.monotonic_ns``), then ``--hold`` seconds of sleep before exit.

Run::

    python3.13t free_threaded_grow.py --mib 40
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from workload_common import MIB, emit, rss_bytes, wait_for_start

#: Bytes each row adds (``sys.getsizeof`` of a 400-byte payload, plus its list slot).
ROW_BYTES = 433 + 8

#: Each thread's rows, kept until exit.
_KEEP: list[object] = []


def grow_rows(rows: int, arrived: list[int], spans: list[dict[str, int]]) -> None:
    """Wait for the other thread, then build ``rows`` rows (the growth is in this frame)."""
    arrived.append(threading.get_native_id())
    while len(arrived) < 2:
        pass
    began = time.monotonic_ns()
    out = []
    for i in range(rows):
        out.append(b"%0400d" % i)
    ended = time.monotonic_ns()
    sizes = sum(sys.getsizeof(row) for row in out) + sys.getsizeof(out)
    spans.append({"native_id": threading.get_native_id(), "start_ns": began,
                  "end_ns": ended, "getsizeof_bytes": sizes})
    _KEEP.append(out)


def main() -> int:
    """Grow on two threads, report, hold, exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=40.0, help="MiB per thread (default 40)")
    parser.add_argument("--hold", type=float, default=1.0,
                        help="seconds to live after growing, so a tracer reads the code objects (default 1)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds to wait after ready before growing, so a tracer started "
                             "with the process has found its interpreter (default 0)")
    args = parser.parse_args()
    rows = int(args.mib * MIB / ROW_BYTES)
    emit("ready", gil_enabled=sys._is_gil_enabled())
    wait_for_start(args.start_delay)
    arrived: list[int] = []
    spans: list[dict[str, int]] = []
    threads = [threading.Thread(target=grow_rows, args=(rows, arrived, spans)) for _ in range(2)]
    before = rss_bytes()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    grown = rss_bytes() - before
    emit("grown", function="grow_rows", rss_growth_bytes=grown,
         getsizeof_bytes=sum(span.pop("getsizeof_bytes") for span in spans), threads=spans)
    time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
