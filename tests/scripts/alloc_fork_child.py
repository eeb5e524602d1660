"""Test workload of allocator mode: the parent forks; the child keeps ``--mib`` MiB of
small objects in ``child_keeps`` and exits; the parent waits for it.

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "child", "pid": ..., "function": "child_keeps", "getsizeof_bytes": ...,
  "start_time_ticks": ...}`` from the child;
* ``{"event": "parent", "pid": ..., "child_pid": ...}`` from the parent.

Run::

    python alloc_fork_child.py --mib 32 --start-delay 0.5
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from workload_common import MIB, emit, start_time_ticks

_KEPT: list[bytes] = []


def child_keeps(target_bytes: int) -> int:
    """Append distinct 417-byte ``bytes`` objects to ``_KEPT`` until ``target_bytes``."""
    total = 0
    index = 0
    while total < target_bytes:
        obj = index.to_bytes(8, "little") * 48
        _KEPT.append(obj)
        total += sys.getsizeof(obj)
        index += 1
    return total + sys.getsizeof(_KEPT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--start-delay", type=float, default=0.5,
                        help="seconds the child waits before allocating (default 0.5)")
    args = parser.parse_args()
    pid = os.fork()
    if pid == 0:
        # Give memtrace time to attach the child's allocator probes (it never
        # pauses a process; allocations before then are not seen).
        time.sleep(args.start_delay)
        kept = child_keeps(args.mib * MIB)
        emit("child", function="child_keeps", getsizeof_bytes=kept,
             start_time_ticks=start_time_ticks())
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    emit("parent", child_pid=pid)


if __name__ == "__main__":
    main()
