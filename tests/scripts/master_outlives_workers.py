"""Test workload (copy-on-write): workers un-share the master's table, exit, then the master writes to it alone.

The master builds ``--table-mib`` MiB of distinct ``bytes`` rows in
:func:`build_table` (module-level ``_TABLE``) and forks ``--workers``
workers. Each runs :func:`walk_table`, which reads every row: the
reference-count writes copy the master's pages into the worker
(copy-on-write), and exits. Once every worker is gone the master runs
:func:`walk_table` itself: its writes fault on pages still write-protected
since the forks, which the kernel now reuses in place (no other process
maps them), so nothing is copied. It then idles ``--idle`` seconds and
exits. Stdlib only; everything is bounded.

Output (JSON lines, see ``workload_common.py``; ``*_status`` are
:func:`workload_common.proc_status` dicts, ``smaps`` a
:func:`workload_common.smaps_rollup` dict, in bytes):

* each worker: ``{"event": "worker_walked", "pid": ..., "rows": ..., "smaps": {...}}``;
* master: ``{"event": "master_walked", "pid": ..., "workers": [pid, ...], "rows": ...,
  "status_before": {...}, "status_after": {...}}`` after its own walk.

Run::

    python master_outlives_workers.py --workers 2 --table-mib 120
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from workload_common import MIB, emit, proc_status, smaps_rollup

#: Payload bytes of each row (a repeated 8-digit number, so rows differ).
ROW_PAYLOAD_BYTES = 384

#: The master's table, built before the forks.
_TABLE: list[bytes] = []


def build_table(target_bytes: int) -> None:
    """Fill ``_TABLE`` with distinct rows worth about ``target_bytes``."""
    repeat = ROW_PAYLOAD_BYTES // 8
    held = 0
    while held < target_bytes:
        row = (b"%08d" % len(_TABLE)) * repeat
        _TABLE.append(row)
        held += sys.getsizeof(row) + 8


def walk_table() -> int:
    """Read every row of ``_TABLE`` (each read writes the row's reference count); return the rows seen."""
    seen = 0
    for row in _TABLE:
        seen += len(row) > 0
    return seen


def main(argv: list[str] | None = None) -> int:
    """Build, fork walking workers, wait for them, walk alone, idle; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="forked workers (default 2)")
    parser.add_argument("--table-mib", type=float, default=120.0, help="MiB of the master's table (default 120)")
    parser.add_argument("--idle", type=float, default=1.5, help="seconds idle before and after (default 1.5)")
    args = parser.parse_args(argv)
    time.sleep(args.idle)
    build_table(int(args.table_mib * MIB))
    workers = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:
            rows = walk_table()
            emit("worker_walked", rows=rows, smaps=smaps_rollup())
            sys.stdout.flush()
            os._exit(0)
        workers.append(pid)
    for pid in workers:
        os.waitpid(pid, 0)
    before = proc_status()
    rows = walk_table()
    emit("master_walked", workers=workers, rows=rows, status_before=before, status_after=proc_status())
    time.sleep(args.idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
