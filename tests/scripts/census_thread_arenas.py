"""Test workload of the census's glibc thread arenas: ``--threads`` threads run at once
(a barrier keeps them all alive, so glibc gives each its own arena), each builds ``--mib``
MiB of 64 KiB ``bytes`` blocks in ``build_blocks`` (larger than pymalloc's 512 B: glibc's
``malloc`` in that thread's arena, below its 128 KiB mmap threshold), then frees all but its
last block, which sits next to the arena's top and keeps the heap from being trimmed. The
program's live data is then a few MiB; the resident memory stays in the arenas. It holds
for ``--hold`` seconds (or until a line on stdin with ``--hold -1``), then exits.

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "freed", "pid": ..., "function": "build_blocks", "built_bytes": ...,
  "pymalloc_live_bytes": ..., "glibc_in_use_bytes": ..., "glibc_free_bytes": ...,
  "glibc_mmapped_bytes": ..., "rss_anon_bytes": ...}``: the allocators' own totals
  (``census_truth.py``) once every thread has freed.

Run::

    python census_thread_arenas.py --threads 8 --mib 48 --hold 3
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from census_truth import glibc_totals, pymalloc_live_bytes
from workload_common import MIB, emit, proc_status, wait_for_start

#: Bytes of each block's payload (a bytes object adds its 33-byte header).
BLOCK_BYTES = 64 * 1024

#: Each thread's last block, kept until the process exits.
_KEPT: list[bytes] = []


def build_blocks(target_bytes: int, barrier: threading.Barrier) -> None:
    """Build ``target_bytes`` of 64 KiB blocks, wait for every thread, free all but the
    last."""
    blocks = [b"\x01" * BLOCK_BYTES for _ in range(target_bytes // BLOCK_BYTES)]
    barrier.wait()
    _KEPT.append(blocks[-1])
    del blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--mib", type=int, default=48)
    parser.add_argument("--hold", type=float, default=3.0)
    parser.add_argument("--start-delay", type=float, default=0.0)
    args = parser.parse_args()
    wait_for_start(args.start_delay)
    barrier = threading.Barrier(args.threads)
    threads = [threading.Thread(target=build_blocks, args=(args.mib * MIB, barrier))
               for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    emit("freed", function="build_blocks", built_bytes=args.threads * args.mib * MIB,
         pymalloc_live_bytes=pymalloc_live_bytes(), rss_anon_bytes=proc_status()["RssAnon"],
         **glibc_totals())
    if args.hold < 0:
        sys.stdin.readline()
    else:
        time.sleep(args.hold)


if __name__ == "__main__":
    main()
