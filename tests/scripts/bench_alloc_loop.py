"""Benchmark workload: an allocation-heavy loop that does not grow memory (5M small dicts, discarded).

:func:`allocate_and_discard` creates ``--iterations`` small dicts and drops
each one at once, so pymalloc reuses the same few pools: millions of
allocations, almost no new resident pages. A tracer whose cost follows page
growth (memtrace's default mode) should cost nothing here; one whose cost
follows allocation count would show up at once.

Output: one JSON line ``{"event": "timed", "pid": ..., "phase_seconds": ...,
"iterations": ..., "rss_growth_bytes": ...}``; ``phase_seconds`` times the loop
only (``time.perf_counter``), not interpreter start-up or tracer attach.

Run::

    python bench_alloc_loop.py --iterations 5000000
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import emit, rss_bytes, wait_for_start


def allocate_and_discard(iterations: int) -> int:
    """Create ``iterations`` two-key dicts, each discarded at once; return the sum of their lengths."""
    total = 0
    for index in range(iterations):
        record = {"index": index, "square": index * index}
        total += len(record)
    return total


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the workload's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5_000_000, help="dicts to create (default 5000000)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds to wait before the timed loop, so a tracer can attach (default 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the timed loop once and print its JSON line; exit 0."""
    args = parse_args(argv)
    wait_for_start(args.start_delay)
    rss_before = rss_bytes()
    started = time.perf_counter()
    allocate_and_discard(args.iterations)
    phase_seconds = time.perf_counter() - started
    emit("timed", phase_seconds=round(phase_seconds, 6), iterations=args.iterations,
         rss_growth_bytes=rss_bytes() - rss_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
