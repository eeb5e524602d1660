"""Test workload for attaching (``memtrace record --pid``): idle until triggered, then grow in ``grow_after_attach``.

The process prints its pid, then idles until ``--trigger-file`` appears or
``--start-delay`` seconds pass (whichever is first; the wait is bounded by
``--start-delay``). A test starts it, attaches the tracer to the printed pid,
then creates the trigger file. :func:`grow_after_attach` then appends
distinct ~417-byte ``bytes`` objects to the module-level list ``_GROWN``
until ``--mib`` MiB (by ``sys.getsizeof`` sums) are retained, the process
holds them ``--hold`` seconds and exits.

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "ready", "pid": ..., "trigger_file": ..., "start_delay_seconds": ...}``;
* ``{"event": "started", "pid": ..., "by": "trigger"|"delay"}`` when the wait ends;
* ``{"event": "grown", "pid": ..., "function": "grow_after_attach", "requested_bytes": ...,
  "getsizeof_bytes": ..., "rss_before_bytes": ..., "rss_after_bytes": ...,
  "rss_growth_bytes": ..., "grow_seconds": ...}``;
* ``{"event": "exit", "pid": ...}``.

Run::

    python wait_then_grow.py --mib 128 --trigger-file /tmp/go --start-delay 30 --hold 2
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import MIB, emit, rss_bytes, wait_for_start

#: Payload bytes of each object (a repeated 8-digit number, so objects differ).
OBJECT_PAYLOAD_BYTES = 384

#: Filled by :func:`grow_after_attach`, never emptied.
_GROWN: list[bytes] = []


def grow_after_attach(target_bytes: int) -> int:
    """Append distinct bytes objects to ``_GROWN`` until their ``sys.getsizeof`` sum reaches ``target_bytes``.

    Returns the ``sys.getsizeof`` sum of the added objects.
    """
    repeat = OBJECT_PAYLOAD_BYTES // 8
    added_bytes = 0
    count = 0
    while added_bytes < target_bytes:
        item = (b"%08d" % count) * repeat
        _GROWN.append(item)
        added_bytes += sys.getsizeof(item)
        count += 1
    return added_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the workload's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=128.0, help="MiB to grow by (default 128)")
    parser.add_argument("--trigger-file", default=None, help="start growing as soon as this file exists")
    parser.add_argument("--start-delay", type=float, default=10.0,
                        help="start growing after this many seconds if not triggered earlier (default 10)")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds to hold the memory before exiting (default 2)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Wait for the trigger, grow, report, hold, exit 0."""
    args = parse_args(argv)
    emit("ready", trigger_file=args.trigger_file, start_delay_seconds=args.start_delay)
    emit("started", by=wait_for_start(args.start_delay, args.trigger_file))
    target_bytes = int(args.mib * MIB)
    rss_before = rss_bytes()
    started = time.perf_counter()
    grown_bytes = grow_after_attach(target_bytes)
    grow_seconds = time.perf_counter() - started
    rss_after = rss_bytes()
    emit("grown", function="grow_after_attach", requested_bytes=target_bytes,
         getsizeof_bytes=grown_bytes + sys.getsizeof(_GROWN), rss_before_bytes=rss_before,
         rss_after_bytes=rss_after, rss_growth_bytes=rss_after - rss_before, grow_seconds=round(grow_seconds, 6))
    time.sleep(max(0.0, args.hold))
    emit("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
