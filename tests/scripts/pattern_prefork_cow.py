"""Test workload (worker multiplication): the master builds a large table, forks N workers that each walk it and grow.

The master builds ``--table-mib`` MiB of distinct ``bytes`` rows in
:func:`build_table` (module-level ``_TABLE``), then forks ``--workers``
workers ``--fork-gap`` seconds apart. Each worker runs :func:`walk_table`,
which reads every row (the reference-count writes un-share the master's
pages: copy-on-write), then :func:`handle_requests`, which grows
``--own-mib`` MiB of its own, and holds both until ``--seconds`` after the
first fork. Stdlib only; everything is bounded.

Output (JSON lines, see ``workload_common.py``): ``{"event": "forked",
"pid": <master>, "workers": [pid, ...], "table_bytes": ...}`` after the
last fork; each worker prints ``{"event": "worker_done", "pid": ...,
"walked_rows": ..., "own_bytes": ...}``.

Run::

    python pattern_prefork_cow.py --workers 3 --table-mib 56 --own-mib 16
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from workload_common import MIB, emit

#: Payload bytes of each row (a repeated 8-digit number, so rows differ).
ROW_PAYLOAD_BYTES = 384

#: The master's table, shared with the workers at fork.
_TABLE: list[bytes] = []

#: Each worker's own state, grown by :func:`handle_requests`.
_OWN: list[bytes] = []


def build_table(target_bytes: int) -> None:
    """Append distinct rows to ``_TABLE`` until their ``sys.getsizeof`` sum reaches ``target_bytes``."""
    repeat = ROW_PAYLOAD_BYTES // 8
    added = 0
    while added < target_bytes:
        row = (b"%08d" % len(_TABLE)) * repeat
        _TABLE.append(row)
        added += sys.getsizeof(row)


def walk_table() -> int:
    """Read every row of the inherited table (touching each object's reference count); return the rows read."""
    rows = 0
    for row in _TABLE:
        rows += len(row) > 0
    return rows


def handle_requests(target_bytes: int) -> int:
    """Grow ``_OWN`` by ``target_bytes`` of distinct rows; return the ``sys.getsizeof`` sum added."""
    repeat = ROW_PAYLOAD_BYTES // 8
    added = 0
    while added < target_bytes:
        row = (b"w%07d" % len(_OWN)) * repeat
        _OWN.append(row)
        added += sys.getsizeof(row)
    return added


def run_worker(own_bytes: int, deadline: float) -> None:
    """Body of a worker: walk the table, grow its own state, hold both until ``deadline``."""
    rows = walk_table()
    grown = handle_requests(own_bytes)
    time.sleep(max(0.0, deadline - time.monotonic()))
    emit("worker_done", walked_rows=rows, own_bytes=grown)


def main(argv: list[str] | None = None) -> int:
    """Build, fork the workers one by one, wait for them; exit 0 when all exited 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3, help="workers to fork (default 3)")
    parser.add_argument("--table-mib", type=float, default=56.0, help="MiB of the master's table (default 56)")
    parser.add_argument("--own-mib", type=float, default=16.0, help="MiB each worker grows (default 16)")
    parser.add_argument("--fork-gap", type=float, default=0.7, help="seconds between forks (default 0.7)")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="workers exit this many seconds after the first fork (default 5)")
    args = parser.parse_args(argv)
    build_table(int(args.table_mib * MIB))
    time.sleep(0.5)
    deadline = time.monotonic() + args.seconds
    pids = []
    for _ in range(args.workers):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                run_worker(int(args.own_mib * MIB), deadline)
                code = 0
            finally:
                sys.stdout.flush()
                os._exit(code)
        pids.append(pid)
        time.sleep(args.fork_gap)
    emit("forked", workers=pids, table_bytes=int(args.table_mib * MIB))
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
