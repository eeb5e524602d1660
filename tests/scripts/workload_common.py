"""Shared helpers of memtrace's test and benchmark workloads: RSS, JSON output, start gates.

The workloads (``grow_cache.py``, ``prefork_one_leaks.py``, ``wait_then_grow.py``,
``prefork_staggered.py``, ``recycle_workers.py``, ``hold_then_exit.py``,
``grow_then_exec.py``, ``reuse_buffer.py``, ``read_mapped_file.py``,
``prefork_readers.py``, ``bench_*.py``) import this module from their own directory. It never
allocates on a workload's behalf: every byte a workload is expected to grow
is allocated inside that workload's own named function, so a tracer can
attribute it there.

Output contract: each workload prints JSON lines on stdout, one object per
line, each with an ``"event"`` and the ``"pid"`` of the process that printed it.

Memory readings (all in bytes, all about the calling process):

* :func:`rss_bytes`: resident set size, ``/proc/self/statm``;
* :func:`proc_status`: ``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile``, ``RssShmem``
  of ``/proc/self/status`` (the kernel's per-process counters);
* :func:`smaps_rollup`: ``Rss``, ``Pss``, the ``Shared_*``/``Private_*`` split and
  ``Uss`` of ``/proc/self/smaps_rollup`` (a page-table walk: exact, but slower).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

#: Bytes per MiB, for the ``--mib`` options.
MIB = 1 << 20

#: Fields of ``/proc/self/status`` returned by :func:`proc_status`.
PROC_STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")

#: Fields of ``/proc/self/smaps_rollup`` returned by :func:`smaps_rollup` (plus the derived ``Uss``).
SMAPS_ROLLUP_FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Shared_Clean",
                       "Shared_Dirty", "Private_Clean", "Private_Dirty")


def rss_bytes() -> int:
    """Return this process's resident set size in bytes, from ``/proc/self/statm`` (field 2, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


def _kib_fields(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """Read the ``Name:  <n> kB`` lines of ``path`` whose name is in ``names``; return them in bytes."""
    wanted = set(names)
    values: dict[str, int] = {}
    with open(path) as lines:
        for line in lines:
            name, sep, rest = line.partition(":")
            if sep and name in wanted:
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    values[name] = int(parts[0]) * 1024
    return values


def proc_status() -> dict[str, int]:
    """Return this process's memory counters of ``/proc/self/status`` in bytes.

    Keys as the kernel names them (see :data:`PROC_STATUS_FIELDS`): ``VmRSS``
    (resident set size = ``RssAnon + RssFile + RssShmem``), ``VmHWM`` (peak
    ``VmRSS`` since the process started or last exec'd), ``RssAnon`` (resident
    anonymous pages: the heap, pymalloc arenas, large ``malloc`` blocks),
    ``RssFile`` (resident pages of mapped files, the interpreter and its
    libraries included) and ``RssShmem`` (resident shared memory, tmpfs files
    included). The kernel reports them in kB (KiB); they are converted to bytes.
    A field the kernel does not report is left out.
    """
    return _kib_fields("/proc/self/status", PROC_STATUS_FIELDS)


def smaps_rollup() -> dict[str, int]:
    """Return this process's ``/proc/self/smaps_rollup`` totals in bytes, plus the derived ``Uss``.

    Keys as the kernel names them (see :data:`SMAPS_ROLLUP_FIELDS`): ``Rss``,
    ``Pss`` (proportional set size: each page divided by the number of
    processes mapping it) and its ``Pss_Anon``/``Pss_File``/``Pss_Shmem``
    split, ``Shared_Clean``/``Shared_Dirty`` (resident pages mapped by more
    than one process, e.g. the copy-on-write pages a forked child still
    shares with its parent) and ``Private_Clean``/``Private_Dirty`` (resident
    pages mapped by this process only). ``"Uss"`` (unique set size, what
    would be freed if the process exited) is ``Private_Clean + Private_Dirty``.
    The kernel computes these by walking the page tables at read time (exact,
    unlike ``/proc/self/status``), in kB (KiB); they are converted to bytes.
    A field the kernel does not report is left out.
    """
    values = _kib_fields("/proc/self/smaps_rollup", SMAPS_ROLLUP_FIELDS)
    values["Uss"] = values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)
    return values


def start_time_ticks() -> int:
    """Return this process's start time: field 22 (``starttime``) of ``/proc/self/stat``.

    Unit: clock ticks since boot (``os.sysconf("SC_CLK_TCK")`` per second,
    usually 100). Together with the pid it names a process uniquely, even
    when the pid is reused. Field 2 (``comm``, in parentheses) may itself
    contain spaces and parentheses, so the line is split after its *last*
    ``)``: the field after it is field 3, so field 22 is the 20th one there.
    """
    with open("/proc/self/stat") as stat:
        line = stat.read()
    after_comm = line[line.rindex(")") + 1:].split()
    return int(after_comm[22 - 3])


def emit(event: str, **fields: object) -> None:
    """Print ``{"event": event, "pid": <this pid>, ...fields}`` as one JSON line and flush it.

    One ``write`` per line (not ``print``, which writes the newline separately
    when stdout is unbuffered); lines stay far below PIPE_BUF, so lines of
    forked processes sharing a pipe do not interleave.
    """
    sys.stdout.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")
    sys.stdout.flush()


def wait_for_start(delay_seconds: float, trigger_file: str | None = None) -> str:
    """Block until ``trigger_file`` exists or ``delay_seconds`` have passed, whichever comes first.

    With no trigger file this is a plain sleep of ``delay_seconds``. The wait
    is always bounded by ``delay_seconds``. Returns ``"trigger"`` or ``"delay"``.
    """
    give_up = time.monotonic() + max(0.0, delay_seconds)
    while True:
        if trigger_file is not None and Path(trigger_file).exists():
            return "trigger"
        remaining = give_up - time.monotonic()
        if remaining <= 0:
            return "delay"
        time.sleep(min(remaining, 0.05))
