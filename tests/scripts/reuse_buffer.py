"""Test workload: jobs each fill a new ``--buffer-mib`` MiB buffer in ``fill_buffer``; the first few are kept.

Each of the ``--jobs`` jobs calls :func:`fill_buffer`, which returns a new
``bytearray`` of ``--buffer-mib`` MiB with every page written (one byte per
4096). The first ``--keep`` buffers are kept in the module-level list
``_KEPT``; each later one is dropped before the next job starts (no two
transient buffers ever coexist). A 40 MiB block is above glibc's largest
dynamic mmap threshold (32 MiB on 64-bit), so each buffer is its own
``mmap`` and dropping it is an ``munmap``: the pages touched add up to
``jobs * buffer`` while the resident peak (``VmHWM``) stays near
``keep * buffer + buffer`` above the start. After the last job the script
holds the kept buffers for ``--idle-seconds`` and exits normally.

Output (JSON lines, see ``workload_common.py``; ``status*`` are
:func:`workload_common.proc_status` dicts, in bytes):

* ``{"event": "start", "pid": ..., "status": {...}}`` at start;
* per job ``{"event": "job", "pid": ..., "job": j, "kept": true|false, "buffer_bytes": ...,
  "status": {...}}`` after the job (after dropping its buffer if not kept);
* ``{"event": "done", "pid": ..., "function": "fill_buffer", "jobs": ..., "buffer_bytes": ...,
  "touched_bytes": <jobs * buffer>, "kept_bytes": <keep * buffer>, "status_start": {...},
  "status": {...}, "hwm_growth_bytes": <VmHWM - VmRSS at start>}`` after the last job, before idling.

Run::

    python reuse_buffer.py --jobs 30 --buffer-mib 40 --keep 4 --idle-seconds 1
"""

from __future__ import annotations

import argparse
import sys
import time

from workload_common import MIB, emit, proc_status

#: Bytes between two written bytes of a buffer: one per (4 KiB) page.
PAGE_STRIDE = 4096

#: The kept buffers: the first ``--keep`` results of :func:`fill_buffer`, held until exit.
_KEPT: list[bytearray] = []


def fill_buffer(size_bytes: int) -> bytearray:
    """Return a new ``bytearray`` of ``size_bytes`` with one byte written in every 4 KiB page."""
    buffer = bytearray(size_bytes)
    pages = len(range(0, size_bytes, PAGE_STRIDE))
    buffer[::PAGE_STRIDE] = b"\x01" * pages
    return buffer


def main(argv: list[str] | None = None) -> int:
    """Run the jobs, keep the first ones, report, idle; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="number of jobs (default 30)")
    parser.add_argument("--buffer-mib", type=float, default=40.0, help="MiB of each job's buffer (default 40)")
    parser.add_argument("--keep", type=int, default=4, help="the first KEEP buffers are kept (default 4)")
    parser.add_argument("--idle-seconds", type=float, default=1.0,
                        help="seconds to hold the kept buffers after the last job (default 1)")
    args = parser.parse_args(argv)
    if args.jobs < 0 or args.keep < 0 or args.buffer_mib <= 0:
        parser.error("need --jobs >= 0, --keep >= 0 and --buffer-mib > 0")
    size = int(args.buffer_mib * MIB)
    start = proc_status()
    emit("start", status=start)
    for job in range(args.jobs):
        buffer = fill_buffer(size)
        kept = job < args.keep
        if kept:
            _KEPT.append(buffer)
        del buffer  # the only other reference: a dropped buffer is freed (munmap) here
        emit("job", job=job, kept=kept, buffer_bytes=size, status=proc_status())
    now = proc_status()
    emit("done", function="fill_buffer", jobs=args.jobs, buffer_bytes=size, touched_bytes=args.jobs * size,
         kept_bytes=len(_KEPT) * size, status_start=start, status=now, hwm_growth_bytes=now["VmHWM"] - start["VmRSS"])
    time.sleep(max(0.0, args.idle_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
