"""Shared helpers of memtrace's test and benchmark workloads: RSS, JSON output, start gates.

The workloads (``grow_cache.py``, ``prefork_one_leaks.py``, ``wait_then_grow.py``,
``bench_*.py``) import this module from their own directory. It never
allocates on a workload's behalf: every byte a workload is expected to grow
is allocated inside that workload's own named function, so a tracer can
attribute it there.

Output contract: each workload prints JSON lines on stdout, one object per
line, each with an ``"event"`` and the ``"pid"`` of the process that printed it.
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


def rss_bytes() -> int:
    """Return this process's resident set size in bytes, from ``/proc/self/statm`` (field 2, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


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
