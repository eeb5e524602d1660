"""Test workload: grow a module-level cache by a known number of bytes in ``fill_cache``, hold, exit.

Every byte of growth is allocated inside :func:`fill_cache` (the innermost
Python frame of each allocation): distinct ``bytes`` objects of
:data:`OBJECT_PAYLOAD_BYTES` payload (417 bytes each with the object header,
so they live in pymalloc pools, the Python heap) appended to the
module-level list ``_CACHE``. Nothing is freed until exit: the growth is
retained.

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "ready", "pid": ...}`` at start, before ``--start-delay``;
* ``{"event": "grown", "pid": ..., "function": "fill_cache", "requested_bytes": ...,
  "getsizeof_bytes": ..., "rss_before_bytes": ..., "rss_after_bytes": ...,
  "rss_growth_bytes": ..., "objects": ..., "fill_seconds": ...}`` after growing.
  ``getsizeof_bytes`` is the sum of ``sys.getsizeof`` over the new objects and
  the cache list; ``rss_growth_bytes`` is the RSS difference around the fill;
* ``{"event": "exit", "pid": ...}`` after ``--hold`` seconds.

Run::

    python grow_cache.py --mib 256 --hold 2 --start-delay 0
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import MIB, emit, rss_bytes, wait_for_start

#: Payload bytes of each cached object (a repeated 8-digit number, so objects differ).
OBJECT_PAYLOAD_BYTES = 384

#: The cache that grows without bound: filled by :func:`fill_cache`, never emptied.
_CACHE: list[bytes] = []


def fill_cache(target_bytes: int) -> tuple[int, int]:
    """Append distinct bytes objects to ``_CACHE`` until their ``sys.getsizeof`` sum reaches ``target_bytes``.

    Returns ``(objects added, sys.getsizeof sum of the added objects)``.
    """
    repeat = OBJECT_PAYLOAD_BYTES // 8
    added_bytes = 0
    count = 0
    while added_bytes < target_bytes:
        item = (b"%08d" % count) * repeat
        _CACHE.append(item)
        added_bytes += sys.getsizeof(item)
        count += 1
    return count, added_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the workload's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=256.0, help="MiB to add to the cache (default 256)")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds to hold the cache before exiting (default 2)")
    parser.add_argument("--start-delay", type=float, default=0.0,
                        help="seconds to wait before growing, so a tracer can attach (default 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Wait, grow, report, hold, exit 0."""
    args = parse_args(argv)
    emit("ready", start_delay_seconds=args.start_delay)
    wait_for_start(args.start_delay)
    target_bytes = int(args.mib * MIB)
    rss_before = rss_bytes()
    started = time.perf_counter()
    objects, objects_bytes = fill_cache(target_bytes)
    fill_seconds = time.perf_counter() - started
    rss_after = rss_bytes()
    emit("grown", function="fill_cache", requested_bytes=target_bytes,
         getsizeof_bytes=objects_bytes + sys.getsizeof(_CACHE), objects=objects,
         rss_before_bytes=rss_before, rss_after_bytes=rss_after, rss_growth_bytes=rss_after - rss_before,
         fill_seconds=round(fill_seconds, 6))
    time.sleep(max(0.0, args.hold))
    emit("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
