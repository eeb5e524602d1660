"""Test workload (spike): one function builds a large payload, holds it briefly, frees it; the process then idles.

:func:`build_payload` builds ``--mib`` MiB as a list of distinct ``bytes``
rows (pymalloc arenas) and joins them into one blob (a large ``mmap``'d
block), holds them ``--hold`` seconds, and returns the blob's length; both
are freed on return, so resident memory falls back. The process idles
``--idle-before`` seconds before and ``--idle-after`` seconds after.

Output (JSON lines, see ``workload_common.py``): ``{"event": "spike",
"pid": ..., "function": "build_payload", "rss_before_bytes": ...,
"rss_peak_bytes": ..., "rss_after_bytes": ...}`` after the free.

Run::

    python pattern_spike.py --mib 120 --hold 0.6 --idle-after 3
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import MIB, emit, rss_bytes

#: Payload bytes of each row (a repeated 8-digit number, so rows differ).
ROW_PAYLOAD_BYTES = 384


def build_payload(target_bytes: int, hold_seconds: float) -> tuple[int, int]:
    """Build rows worth half of ``target_bytes`` and a joined blob of them, hold both, free both.

    Returns ``(blob length, RSS at the peak)``.
    """
    repeat = ROW_PAYLOAD_BYTES // 8
    rows = []
    added = 0
    while added < target_bytes // 2:
        row = (b"%08d" % len(rows)) * repeat
        rows.append(row)
        added += sys.getsizeof(row)
    blob = b"".join(rows)
    peak = rss_bytes()
    time.sleep(hold_seconds)
    return len(blob), peak


def main(argv: list[str] | None = None) -> int:
    """Idle, spike, idle; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=120.0, help="MiB of the payload at its peak (default 120)")
    parser.add_argument("--hold", type=float, default=0.6, help="seconds the payload is held (default 0.6)")
    parser.add_argument("--idle-before", type=float, default=1.0, help="seconds idle before (default 1)")
    parser.add_argument("--idle-after", type=float, default=3.5, help="seconds idle after (default 3.5)")
    args = parser.parse_args(argv)
    time.sleep(args.idle_before)
    before = rss_bytes()
    _length, peak = build_payload(int(args.mib * MIB), args.hold)
    emit("spike", function="build_payload", rss_before_bytes=before, rss_peak_bytes=peak,
         rss_after_bytes=rss_bytes())
    time.sleep(args.idle_after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
