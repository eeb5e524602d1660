"""Benchmark workload: grow resident memory by 1 GiB in ``grow_gib``, timed, after settling the VM.

Settling: this VM hands freed memory back to its host, so the first touch
of fresh memory costs a varying amount (a 1 GiB growth varied 0.58-1.62 s
untraced). Touching and freeing about 1.4 GiB first (:func:`settle_vm`)
brought it to 0.55-0.69 s (``/work/shared/notes/toolchain.md``, "Timing noise").

Growth: :func:`grow_gib` appends distinct ``bytes`` objects of ``--chunk-kib``
KiB (default 1024: each one its own glibc mmap, filled by the repeat, so
every page is touched inside ``grow_gib``) to the module-level list
``_GROWN`` until ``--mib`` MiB (default 1024) are retained. The process then
holds the memory ``--hold`` seconds so a tracer drains all its events.

Output: one JSON line ``{"event": "timed", "pid": ..., "phase_seconds": ...,
"requested_bytes": ..., "rss_growth_bytes": ..., "settle_seconds": ...}``;
``phase_seconds`` times the growth only; ``rss_growth_bytes`` is the RSS
difference around it (``/proc/self/statm``), the true resident growth.

Run::

    python bench_grow.py --mib 1024 --settle-mib 1434 --hold 1
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import MIB, emit, rss_bytes, wait_for_start

#: Grown by :func:`grow_gib`, never emptied before exit.
_GROWN: list[bytes] = []


def settle_vm(settle_bytes: int) -> None:
    """Touch ``settle_bytes`` of fresh memory (one filled bytes object, one mmap) and free it again."""
    ballast = b"\x01" * settle_bytes
    del ballast


def grow_gib(target_bytes: int, chunk_bytes: int) -> int:
    """Append distinct filled bytes objects of ``chunk_bytes`` to ``_GROWN`` until ``target_bytes``.

    Returns the payload bytes added (``len`` sums).
    """
    repeat = max(1, chunk_bytes // 8)
    added_bytes = 0
    count = 0
    while added_bytes < target_bytes:
        chunk = (b"%07d;" % (count % 10_000_000)) * repeat
        _GROWN.append(chunk)
        added_bytes += len(chunk)
        count += 1
    return added_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the workload's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=1024.0, help="MiB to grow by (default 1024)")
    parser.add_argument("--chunk-kib", type=int, default=1024, help="size of each object in KiB (default 1024)")
    parser.add_argument("--settle-mib", type=float, default=1434.0,
                        help="MiB touched and freed before the timed growth; 0 skips it (default 1434)")
    parser.add_argument("--hold", type=float, default=1.0, help="seconds to hold the memory after growing (default 1)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds to wait before settling, so a tracer can attach (default 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Settle, time the growth, print the JSON line, hold, exit 0."""
    args = parse_args(argv)
    wait_for_start(args.start_delay)
    started = time.perf_counter()
    if args.settle_mib > 0:
        settle_vm(int(args.settle_mib * MIB))
    settle_seconds = time.perf_counter() - started
    rss_before = rss_bytes()
    started = time.perf_counter()
    added_bytes = grow_gib(int(args.mib * MIB), args.chunk_kib * 1024)
    phase_seconds = time.perf_counter() - started
    emit("timed", phase_seconds=round(phase_seconds, 6), requested_bytes=added_bytes,
         rss_growth_bytes=rss_bytes() - rss_before, settle_seconds=round(settle_seconds, 6))
    time.sleep(max(0.0, args.hold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
