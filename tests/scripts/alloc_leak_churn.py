"""Test workload of allocator mode: ``keep_small_objects`` keeps ``--keep-mib`` MiB of
small objects; ``churn`` allocates and frees ``--churn-mib`` MiB; ``native_malloc``
calls libc ``malloc`` through ``ctypes`` for ``--native-mib`` MiB and keeps the blocks;
``keep_tuples`` keeps ``--tuples-mib`` MiB of 2-tuples (which Debian's LTO-built
interpreter allocates with pymalloc inlined: its allocator uprobes do not see them).

The functions run after ``--start-delay`` seconds (memtrace attaches a
process's allocator probes tens of milliseconds after it starts, and never
pauses it: allocations before then are not seen). Each function allocates its own bytes (it is the innermost Python frame of
each allocation). ``keep_small_objects`` appends distinct ``bytes`` objects of
417 bytes (pymalloc-sized) to a module-level list, kept until exit.
``churn`` creates and drops 16 KiB ``bytes`` objects one at a time, so it
holds at most one at once. ``native_malloc`` keeps 1 MiB blocks.

Output (JSON lines, see ``workload_common.py``):

* ``{"event": "kept", "pid": ..., "function": "keep_small_objects", "getsizeof_bytes": ...}``:
  the sum of ``sys.getsizeof`` over the kept objects and the list;
* ``{"event": "churned", "pid": ..., "function": "churn", "allocated_bytes": ...}``;
* ``{"event": "native", "pid": ..., "function": "native_malloc", "malloc_bytes": ...}``;
* ``{"event": "tuples", "pid": ..., "function": "keep_tuples", "getsizeof_bytes": ...}``.

Run::

    python alloc_leak_churn.py --keep-mib 100 --churn-mib 400 --native-mib 32 --start-delay 0.5
"""

from __future__ import annotations

import argparse
import ctypes
import sys

from workload_common import MIB, emit, wait_for_start

#: Payload of each kept object: 384 + the 33-byte bytes header = 417 bytes.
KEPT_PAYLOAD_BYTES = 384
#: Payload of each churned object.
CHURN_PAYLOAD_BYTES = 16 * 1024
#: Size of each native block.
NATIVE_BLOCK_BYTES = 1 << 20

_KEPT: list[bytes] = []
_NATIVE: list[int] = []


def keep_small_objects(target_bytes: int) -> int:
    """Append distinct small ``bytes`` objects to ``_KEPT`` until ``target_bytes``."""
    total = 0
    index = 0
    while total < target_bytes:
        obj = index.to_bytes(8, "little") * (KEPT_PAYLOAD_BYTES // 8)
        _KEPT.append(obj)
        total += sys.getsizeof(obj)
        index += 1
    return total + sys.getsizeof(_KEPT)


def keep_tuples(target_bytes: int) -> int:
    """Append distinct 2-tuples of one shared object to ``_KEPT`` until ``target_bytes``."""
    marker = object()
    total = 0
    while total < target_bytes:
        pair = (marker, marker)
        _KEPT.append(pair)
        total += sys.getsizeof(pair)
    return total + sys.getsizeof(_KEPT)


def churn(target_bytes: int) -> int:
    """Create and drop ``bytes`` objects totalling ``target_bytes``."""
    total = 0
    index = 0
    while total < target_bytes:
        obj = index.to_bytes(8, "little") * (CHURN_PAYLOAD_BYTES // 8)
        total += sys.getsizeof(obj)
        del obj
        index += 1
    return total


def native_malloc(target_bytes: int) -> int:
    """Keep libc ``malloc`` blocks totalling ``target_bytes``."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    total = 0
    while total < target_bytes:
        _NATIVE.append(libc.malloc(NATIVE_BLOCK_BYTES))
        total += NATIVE_BLOCK_BYTES
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep-mib", type=int, default=0)
    parser.add_argument("--churn-mib", type=int, default=0)
    parser.add_argument("--native-mib", type=int, default=0)
    parser.add_argument("--tuples-mib", type=int, default=0)
    parser.add_argument("--start-delay", type=float, default=0.0)
    args = parser.parse_args()
    wait_for_start(args.start_delay)
    if args.keep_mib:
        kept = keep_small_objects(args.keep_mib * MIB)
        emit("kept", function="keep_small_objects", getsizeof_bytes=kept)
    if args.churn_mib:
        churned = churn(args.churn_mib * MIB)
        emit("churned", function="churn", allocated_bytes=churned)
    if args.native_mib:
        native = native_malloc(args.native_mib * MIB)
        emit("native", function="native_malloc", malloc_bytes=native)
    if args.tuples_mib:
        tuples = keep_tuples(args.tuples_mib * MIB)
        emit("tuples", function="keep_tuples", getsizeof_bytes=tuples)


if __name__ == "__main__":
    main()
