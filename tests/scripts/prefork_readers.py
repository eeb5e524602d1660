"""Test workload (copy-on-write): a master builds ~``--mib`` MiB of small objects; forked workers only read them.

The master runs :func:`build_shared_data`, which appends distinct
``(int, str)`` tuples (a 2-digit int above 2**30 and an 8-character str:
three small pymalloc objects, 160 bytes plus the 8-byte list slot) to the
module-level list ``_SHARED`` until ``--mib`` MiB are held (counted in
pymalloc blocks: ``sys.getsizeof`` rounded up to 16 bytes, plus the
slot), optionally runs ``gc.freeze()`` (``--gc-freeze``), then forks
``--workers`` workers ``--fork-gap`` seconds apart. Each worker runs
:func:`read_inherited`, which reads every inherited object (unpacks each
tuple, sums the ints' low bits and the strs' lengths and hashes) and keeps
nothing. Reading a CPython object writes its reference count, so each page
of the master's objects the worker touches is copied (copy-on-write): the
worker's ``VmRSS`` stays about flat (a shared page becomes a private page)
while its ``Uss`` (``Private_*``) and ``Pss`` grow by about the data size.
The list's own pointer array is only read, so it stays shared. Workers hold
until ``--seconds`` after the first fork and exit 0; stdlib only; bounded.

Output (JSON lines, see ``workload_common.py``; ``smaps`` are
:func:`workload_common.smaps_rollup` dicts, ``status`` are
:func:`workload_common.proc_status` dicts, all in bytes):

* master: ``{"event": "built", "pid": ..., "function": "build_shared_data", "objects": ...,
  "data_bytes": ..., "gc_freeze": false, "smaps": {...}, "status": {...}}`` after building;
  ``{"event": "forked", "pid": <master>, "workers": [pid, ...], "smaps": {...}}`` after the last fork;
  ``{"event": "exit", "pid": <master>, "worker_exit_codes": [0, ...]}`` at the end;
* each worker: ``{"event": "smaps_before", "pid": ..., "index": i, "smaps": {...}, "status": {...}}``
  right after its fork; ``{"event": "smaps_after", "pid": ..., "index": i, "function":
  "read_inherited", "objects_read": ..., "checksum": ..., "read_seconds": ..., "smaps": {...},
  "status": {...}, "uss_growth_bytes": ..., "pss_growth_bytes": ..., "rss_growth_bytes":
  <VmRSS after - before>, "shared_drop_bytes": <Shared_* before - after>}`` after reading.

Run::

    python prefork_readers.py --mib 150 --workers 4 --fork-gap 0.2 --seconds 6 [--gc-freeze]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback

from workload_common import MIB, emit, proc_status, smaps_rollup

#: Bytes of one list slot (a pointer), counted with each entry.
SLOT_BYTES = 8

#: pymalloc's block alignment: a block is ``sys.getsizeof`` rounded up to it.
PYMALLOC_ALIGNMENT = 16

#: Smallest int of the data: 2**30 and above take two 30-bit digits (32 bytes, one pymalloc block).
INT_BASE = 1 << 30

#: The master's data, inherited by the workers at fork.
_SHARED: list[tuple[int, str]] = []


def _block_bytes(obj: object) -> int:
    """Return the pymalloc block size of ``obj``: ``sys.getsizeof`` rounded up to :data:`PYMALLOC_ALIGNMENT`."""
    return -(-sys.getsizeof(obj) // PYMALLOC_ALIGNMENT) * PYMALLOC_ALIGNMENT


def build_shared_data(target_bytes: int) -> int:
    """Append distinct ``(int, str)`` tuples to ``_SHARED`` until ``target_bytes`` are held; return the entries.

    Counted per entry: the pymalloc blocks of the tuple, the int and the str
    (64 + 32 + 64 bytes) plus the list slot (8).
    """
    held = 0
    count = 0
    while held < target_bytes:
        entry = (INT_BASE | count, "k%07d" % count)
        _SHARED.append(entry)
        held += _block_bytes(entry) + _block_bytes(entry[0]) + _block_bytes(entry[1]) + SLOT_BYTES
        count += 1
    return count


def read_inherited(data: list[tuple[int, str]]) -> tuple[int, int]:
    """Read every entry of ``data`` (no object kept); return ``(entries read, checksum)``."""
    checksum = 0
    for number, text in data:
        checksum += (number & 1) + len(text) + (hash(text) & 1)
    return len(data), checksum


def run_worker(index: int, deadline: float) -> None:
    """Body of worker ``index``: report, read the inherited data, report, hold until ``deadline``."""
    smaps_start = smaps_rollup()
    status_start = proc_status()
    emit("smaps_before", index=index, smaps=smaps_start, status=status_start)
    started = time.monotonic()
    objects, checksum = read_inherited(_SHARED)
    read_seconds = time.monotonic() - started
    smaps_now = smaps_rollup()
    status_now = proc_status()
    shared_start = smaps_start["Shared_Clean"] + smaps_start["Shared_Dirty"]
    shared_now = smaps_now["Shared_Clean"] + smaps_now["Shared_Dirty"]
    emit("smaps_after", index=index, function="read_inherited", objects_read=objects, checksum=checksum,
         read_seconds=round(read_seconds, 3), smaps=smaps_now, status=status_now,
         uss_growth_bytes=smaps_now["Uss"] - smaps_start["Uss"], pss_growth_bytes=smaps_now["Pss"] - smaps_start["Pss"],
         rss_growth_bytes=status_now["VmRSS"] - status_start["VmRSS"], shared_drop_bytes=shared_start - shared_now)
    time.sleep(max(0.0, deadline - time.monotonic()))


def fork_worker(index: int, deadline: float) -> int:
    """Fork worker ``index``; the child runs :func:`run_worker` and exits without returning."""
    pid = os.fork()
    if pid == 0:
        exit_code = 1
        try:
            run_worker(index, deadline)
            exit_code = 0
        except BaseException:  # noqa: BLE001 (the child must never return into the master's code)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(exit_code)
    return pid


def main(argv: list[str] | None = None) -> int:
    """Build, fork the readers one by one, wait for them; exit 0 when all exited 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=150.0, help="MiB of shared small objects (default 150)")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after building, before forking (default: off)")
    parser.add_argument("--workers", type=int, default=4, help="workers to fork (default 4)")
    parser.add_argument("--fork-gap", type=float, default=0.2, help="seconds between two forks (default 0.2)")
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="workers exit this many seconds after the first fork (default 6)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.mib < 0 or args.fork_gap < 0:
        parser.error("need --workers >= 1, --mib >= 0 and --fork-gap >= 0")
    target_bytes = int(args.mib * MIB)
    objects = build_shared_data(target_bytes)
    if args.gc_freeze:
        gc.freeze()
    emit("built", function="build_shared_data", objects=objects, data_bytes=target_bytes, gc_freeze=args.gc_freeze,
         smaps=smaps_rollup(), status=proc_status())
    deadline = time.monotonic() + args.seconds
    pids = []
    for index in range(args.workers):
        if index:
            time.sleep(args.fork_gap)
        pids.append(fork_worker(index, deadline))
    emit("forked", workers=pids, smaps=smaps_rollup())
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    emit("exit", worker_exit_codes=codes)
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
