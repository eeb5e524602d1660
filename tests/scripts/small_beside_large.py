"""Test workload of byte sampling's error: a small site grows beside a large one.

In ``--rounds`` rounds, ``grow_large`` keeps ``--large-mib / rounds`` MiB and then
``grow_small`` keeps ``--small-mib / rounds`` MiB, each as 256 KiB ``bytes`` blocks (above
glibc's 128 KiB mmap threshold: each block is its own mapping, every page of it written
once), with ``--pause`` seconds between rounds. Each function measures what it added itself:
``RssAnon`` of ``/proc/self/status`` right before and after its call, summed over the
rounds. Everything is kept until the process exits after ``--hold`` seconds.

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "grown", "pid": ..., "large_bytes": ..., "small_bytes": ...}``: the anonymous
  resident growth each function measured of itself, in bytes.

Run::

    python small_beside_large.py --large-mib 100 --small-mib 5 --rounds 10 --pause 0.2
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import MIB, emit, proc_status, wait_for_start

#: Bytes of each block (a bytes object adds its 33-byte header).
BLOCK_BYTES = 256 * 1024

#: Every block made, kept until the process exits.
_KEPT: list[bytes] = []


def anon_bytes() -> int:
    """``RssAnon`` of this process, in bytes."""
    return proc_status()["RssAnon"]


def grow_large(size_bytes: int) -> None:
    """Keep ``size_bytes`` of blocks."""
    _KEPT.extend(b"\x01" * BLOCK_BYTES for _ in range(size_bytes // BLOCK_BYTES))


def grow_small(size_bytes: int) -> None:
    """Keep ``size_bytes`` of blocks."""
    _KEPT.extend(b"\x02" * BLOCK_BYTES for _ in range(size_bytes // BLOCK_BYTES))


def measured(grow, size_bytes: int) -> int:
    """Run ``grow(size_bytes)``; return how much ``RssAnon`` rose over the call."""
    before = anon_bytes()
    grow(size_bytes)
    return anon_bytes() - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-mib", type=float, default=100.0)
    parser.add_argument("--small-mib", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--pause", type=float, default=0.2)
    parser.add_argument("--hold", type=float, default=1.0)
    parser.add_argument("--start-delay", type=float, default=0.0)
    args = parser.parse_args()
    if args.rounds <= 0:
        parser.error("need --rounds > 0")
    wait_for_start(args.start_delay)
    large_step = int(args.large_mib * MIB) // args.rounds
    small_step = int(args.small_mib * MIB) // args.rounds
    large = small = 0
    for _ in range(args.rounds):
        large += measured(grow_large, large_step)
        small += measured(grow_small, small_step)
        time.sleep(args.pause)
    emit("grown", large_bytes=large, small_bytes=small)
    time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
